# cmake -DCMD=python3 -DARGS=a|b|.. -P expect_loss.cmake
# Runs the Redis crash test (crash_test.py) against a server that must lose
# data (durability off) and passes only if the test reports it: exit status 1,
# a final 'rounds=R acked=A lost=L linearizable=X' line with A > 0 and L > 0,
# and X = false when the history was checked.
string(REPLACE "|" ";" _args "${ARGS}")
execute_process(COMMAND ${CMD} ${_args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX MATCH "[^\n]*\n?$" _last "${out}")
string(REGEX MATCH "rounds=([0-9]+) acked=([0-9]+) lost=([0-9]+) linearizable=([a-z]+)" _m "${out}")
message("... ${_last}")
if(NOT rc EQUAL 1 OR NOT _m)
  message("${out}\n${err}")
  message(FATAL_ERROR "durability off was NOT caught (exit ${rc}): the crash test cannot fail")
endif()
if(CMAKE_MATCH_2 EQUAL 0 OR CMAKE_MATCH_3 EQUAL 0)
  message(FATAL_ERROR "crash test exited 1 but reported acked=${CMAKE_MATCH_2} lost=${CMAKE_MATCH_3}")
endif()
if(NOT CMAKE_MATCH_4 STREQUAL "false" AND NOT CMAKE_MATCH_4 STREQUAL "unchecked")
  message(FATAL_ERROR "losses found, but the linearizability checker said linearizable=${CMAKE_MATCH_4}")
endif()
message("durability off caught: acked=${CMAKE_MATCH_2} lost=${CMAKE_MATCH_3} linearizable=${CMAKE_MATCH_4}")

# Runs CMD with '|'-separated ARGS and passes only if the power-failure
# simulator reports violations (exit 1, 'violations=N' with N > 0) and names
# the crash point of the first one.
string(REPLACE "|" ";" _args "${ARGS}")
execute_process(COMMAND ${CMD} ${_args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
string(REGEX MATCH "violations=([0-9]+)" _m "${out}")
if(NOT rc EQUAL 1 OR NOT _m OR CMAKE_MATCH_1 EQUAL 0)
  message(FATAL_ERROR "the mutated runtime was NOT caught (exit ${rc}): the simulator cannot fail")
endif()
string(REGEX MATCH "first violation: crash point '[^']+'" _p "${out}")
if(NOT _p)
  message(FATAL_ERROR "violations reported but no crash point named")
endif()
message("mutation caught: ${_p}")

# Runs CMD with '|'-separated ARGS and passes only if the crash test reports a
# loss: exit status 1 and a final 'lost=N torn=M' line with N+M > 0.
string(REPLACE "|" ";" _args "${ARGS}")
execute_process(COMMAND ${CMD} ${_args} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
string(REGEX MATCH "lost=([0-9]+) torn=([0-9]+)" _m "${out}")
if(NOT rc EQUAL 1 OR NOT _m)
  message(FATAL_ERROR "mutated runtime was NOT caught (exit ${rc}); the crash test cannot fail")
endif()
math(EXPR _bad "${CMAKE_MATCH_1} + ${CMAKE_MATCH_2}")
if(_bad EQUAL 0)
  message(FATAL_ERROR "mutated runtime exited 1 but reported no lost or torn PUTs")
endif()
message("mutation caught: lost=${CMAKE_MATCH_1} torn=${CMAKE_MATCH_2}")

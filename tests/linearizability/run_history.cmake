# cmake -DKV=kvstore -DGO=go [-DGOENV=VAR=..;..] -DSRC=this-folder -DDIR=history
#       -DPOOL=pool -DARGS=a|b|.. -DEXPECT=linearizable|not_linearizable -P run_history.cmake
#
# Builds the checker, runs `kvstore history-test` (a fresh pool and history),
# then checks the history. EXPECT=not_linearizable (mutation runs) passes only
# if the checker reports a violation.
string(REPLACE "|" ";" ARGS "${ARGS}")
set(CHECKER ${DIR}.lincheck)

execute_process(COMMAND ${CMAKE_COMMAND} -E env ${GOENV} ${GO} build -buildvcs=false -o ${CHECKER} .
  WORKING_DIRECTORY ${SRC} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building the checker failed (${rc})")
endif()

string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${KV} history-test --pool ${POOL} --history ${DIR} ${ARGS}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kvstore history-test failed (${rc})")
endif()
string(TIMESTAMP t1 "%s")

# A mutation run only needs the verdict; its explanation (a verbose second
# pass, over a minute on some bad histories) is cut short.
set(EXPLAIN)
if(EXPECT STREQUAL "not_linearizable")
  set(EXPLAIN -explain-timeout 10s)
endif()
execute_process(COMMAND ${CHECKER} -timeout 150s ${EXPLAIN} ${DIR} RESULT_VARIABLE rc)
string(TIMESTAMP t2 "%s")
math(EXPR run_s "${t1} - ${t0}")
math(EXPR check_s "${t2} - ${t1}")
message("history-test ${run_s} s, check ${check_s} s, checker exit ${rc}")

if(EXPECT STREQUAL "linearizable")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the history is not linearizable (or the check failed): see ${DIR}/viz.html")
  endif()
  file(REMOVE_RECURSE ${DIR}) # passed: the logs are not needed
elseif(rc EQUAL 1)
  message("mutation caught: the checker rejected the history, as it must")
else()
  message(FATAL_ERROR "mutation NOT caught (checker exit ${rc}): the history test cannot see lost acknowledged writes")
endif()

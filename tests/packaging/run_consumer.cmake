# cmake -DMODE=find_package|add_subdirectory -DFLASHATTN_SOURCE_DIR=... -DCONSUMER_SOURCE_DIR=...
#       -DWORK_DIR=... [-DGENERATOR=...] [-DCXX_COMPILER=...] [-DEIGEN3_DIR=...] -P run_consumer.cmake
#
# Builds and runs the consumer project against flashattn, from nothing: WORK_DIR is emptied first, so the
# test passes only if a fresh user could do the same.
foreach(var MODE FLASHATTN_SOURCE_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

set(common_args -DCMAKE_BUILD_TYPE=Release)
if(GENERATOR)
  list(APPEND common_args -G "${GENERATOR}")
endif()
if(CXX_COMPILER)
  list(APPEND common_args -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
if(EIGEN3_DIR)
  list(APPEND common_args -DEigen3_DIR=${EIGEN3_DIR})
endif()

# Runs one command, echoing it, and stops the test with its output when it fails.
function(step)
  string(REPLACE ";" " " shown "${ARGN}")
  message(STATUS "+ ${shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (exit ${rc}): ${shown}\n${out}")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

if(MODE STREQUAL "find_package")
  set(prefix ${WORK_DIR}/prefix)
  # Configure flashattn as a user installing it would: only the install rules, no tests.
  step(${CMAKE_COMMAND} -S ${FLASHATTN_SOURCE_DIR} -B ${WORK_DIR}/flashattn-build ${common_args}
       -DCMAKE_INSTALL_PREFIX=${prefix} -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_BENCHMARKS=OFF
       -DFLASHATTN_BUILD_EXAMPLES=OFF)
  step(${CMAKE_COMMAND} --build ${WORK_DIR}/flashattn-build)
  step(${CMAKE_COMMAND} --install ${WORK_DIR}/flashattn-build)
  foreach(installed include/flashattn/flashattn.hpp include/flashattn/cpu/forward_kernel.hpp
                    share/cmake/flashattn/flashattnConfig.cmake share/cmake/flashattn/flashattnConfigVersion.cmake
                    share/cmake/flashattn/flashattnTargets.cmake)
    if(NOT EXISTS ${prefix}/${installed})
      message(FATAL_ERROR "install did not produce ${prefix}/${installed}")
    endif()
  endforeach()
  set(consumer_args -DCMAKE_PREFIX_PATH=${prefix} -DCONSUMER_MODE=find_package)
elseif(MODE STREQUAL "add_subdirectory")
  set(consumer_args -DCONSUMER_MODE=add_subdirectory -DFLASHATTN_SOURCE_DIR=${FLASHATTN_SOURCE_DIR})
else()
  message(FATAL_ERROR "run_consumer.cmake: MODE must be find_package or add_subdirectory, got '${MODE}'")
endif()

step(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/consumer-build ${common_args} ${consumer_args})
step(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
step(${WORK_DIR}/consumer-build/consumer)
message(STATUS "consumer output:\n${step_output}")

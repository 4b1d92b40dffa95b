# cmake -DMODE=find_package|add_subdirectory|fetch_content|pkg_config -DFLASHATTN_SOURCE_DIR=...
#       -DCONSUMER_SOURCE_DIR=... -DWORK_DIR=... [-DGENERATOR=...] [-DCXX_COMPILER=...] [-DEIGEN3_DIR=...]
#       [-DFLASHATTN_VERSION=...] -P run_consumer.cmake
#
# Builds and runs the consumer project against flashattn, from nothing: WORK_DIR is emptied first, so the
# test passes only if a fresh user could do the same. add_subdirectory and fetch_content configure the
# consumer with no build type, as a user who sets none: flashattn must leave it (and its cache entry)
# alone, which the consumer asserts, and the unoptimised program must say once that it is (checked here).
# pkg_config installs flashattn, moves the prefix elsewhere (the .pc file must be relocatable), and
# compiles main.cpp with the compiler and the flags `pkg-config --cflags --libs flashattn` gives.
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

# Installs flashattn to ${WORK_DIR}/prefix as a user would: only the install rules, no tests.
function(install_flashattn prefix)
  step(${CMAKE_COMMAND} -S ${FLASHATTN_SOURCE_DIR} -B ${WORK_DIR}/flashattn-build ${common_args}
       -DCMAKE_INSTALL_PREFIX=${prefix} -DFLASHATTN_BUILD_TESTS=OFF -DFLASHATTN_BUILD_BENCHMARKS=OFF
       -DFLASHATTN_BUILD_EXAMPLES=OFF)
  step(${CMAKE_COMMAND} --build ${WORK_DIR}/flashattn-build)
  step(${CMAKE_COMMAND} --install ${WORK_DIR}/flashattn-build)
endfunction()

if(MODE STREQUAL "pkg_config")
  find_program(PKG_CONFIG_EXECUTABLE NAMES pkg-config pkgconf)
  if(NOT PKG_CONFIG_EXECUTABLE)
    message(FATAL_ERROR "pkg-config is not installed (Debian: pkgconf)")
  endif()
  if(NOT CXX_COMPILER)
    message(FATAL_ERROR "run_consumer.cmake: -DCXX_COMPILER=... is required for MODE=pkg_config")
  endif()
  install_flashattn(${WORK_DIR}/prefix)
  file(RENAME ${WORK_DIR}/prefix ${WORK_DIR}/moved-prefix)
  set(ENV{PKG_CONFIG_PATH} ${WORK_DIR}/moved-prefix/share/pkgconfig)
  step(${PKG_CONFIG_EXECUTABLE} --modversion flashattn)
  string(STRIP "${step_output}" pc_version)
  if(FLASHATTN_VERSION AND NOT pc_version STREQUAL FLASHATTN_VERSION)
    message(FATAL_ERROR "pkg-config says flashattn ${pc_version}, the project is ${FLASHATTN_VERSION}")
  endif()
  step(${PKG_CONFIG_EXECUTABLE} --cflags --libs flashattn)
  string(STRIP "${step_output}" pc_flags)
  if(NOT pc_flags MATCHES "-I[^ ]*/moved-prefix/")
    message(FATAL_ERROR "pkg-config's flags do not point into the moved prefix: ${pc_flags}")
  endif()
  separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
  string(REPLACE "." ";" v "${pc_version}")
  list(GET v 0 major)
  list(GET v 1 minor)
  list(GET v 2 patch)
  step(${CXX_COMPILER} -std=c++17 -O2 -Wall -Wextra -Wpedantic -Werror -DCONSUMER_EXPECT_VERSION=1
       -DCONSUMER_VERSION_MAJOR=${major} -DCONSUMER_VERSION_MINOR=${minor} -DCONSUMER_VERSION_PATCH=${patch}
       ${CONSUMER_SOURCE_DIR}/main.cpp ${pc_flags} -o ${WORK_DIR}/consumer)
  step(${WORK_DIR}/consumer)
  message(STATUS "consumer output:\n${step_output}")
  return()
endif()

if(MODE STREQUAL "find_package")
  set(prefix ${WORK_DIR}/prefix)
  install_flashattn(${prefix})
  foreach(installed include/flashattn/flashattn.hpp include/flashattn/cpu/forward_kernel.hpp
                    share/cmake/flashattn/flashattnConfig.cmake share/cmake/flashattn/flashattnConfigVersion.cmake
                    share/cmake/flashattn/flashattnTargets.cmake share/pkgconfig/flashattn.pc)
    if(NOT EXISTS ${prefix}/${installed})
      message(FATAL_ERROR "install did not produce ${prefix}/${installed}")
    endif()
  endforeach()
  set(consumer_args -DCMAKE_PREFIX_PATH=${prefix} -DCONSUMER_MODE=find_package)
elseif(MODE STREQUAL "add_subdirectory" OR MODE STREQUAL "fetch_content")
  # No build type (see the top): the consumer checks that flashattn leaves it unset.
  list(REMOVE_ITEM common_args -DCMAKE_BUILD_TYPE=Release)
  set(consumer_args -DCONSUMER_MODE=${MODE} -DFLASHATTN_SOURCE_DIR=${FLASHATTN_SOURCE_DIR})
else()
  message(FATAL_ERROR
          "run_consumer.cmake: MODE must be find_package, add_subdirectory, fetch_content or pkg_config, got '${MODE}'")
endif()

step(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/consumer-build ${common_args} ${consumer_args})
step(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer-build)
step(${WORK_DIR}/consumer-build/consumer)
message(STATUS "consumer output:\n${step_output}")
if(MODE STREQUAL "add_subdirectory" OR MODE STREQUAL "fetch_content")
  if(NOT step_output MATCHES "flashattn: this program was compiled without optimisation")
    message(FATAL_ERROR "the unoptimised consumer did not say that it is unoptimised")
  endif()
endif()

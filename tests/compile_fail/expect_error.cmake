# cmake -DCXX=... -DSOURCE=... -DINCLUDE_DIRS="a;b" -P expect_error.cmake
#
# A compile-fail test: SOURCE must not compile, and the compiler's output must contain every text given
# on a `// expect: TEXT` line of SOURCE, with at most one error (a `// max-errors: N` line raises it):
# the mistake is reported once, by the static_assert that names its fix, not by pages of template errors.
foreach(var CXX SOURCE INCLUDE_DIRS)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "expect_error.cmake: -D${var}=... is required")
  endif()
endforeach()

file(STRINGS ${SOURCE} expect_lines REGEX "^// expect: ")
file(STRINGS ${SOURCE} max_lines REGEX "^// max-errors: ")
if(NOT expect_lines)
  message(FATAL_ERROR "${SOURCE} has no `// expect: ` line")
endif()
set(max_errors 1)
if(max_lines)
  string(REGEX REPLACE "^// max-errors: " "" max_errors "${max_lines}")
endif()

set(includes)
foreach(dir IN LISTS INCLUDE_DIRS)
  list(APPEND includes -I${dir})
endforeach()
execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only ${includes} ${SOURCE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but must not")
endif()
foreach(line IN LISTS expect_lines)
  string(REGEX REPLACE "^// expect: " "" text "${line}")
  string(FIND "${out}" "${text}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the compiler's output lacks \"${text}\":\n${out}")
  endif()
endforeach()
string(REGEX MATCHALL "error:" errors "${out}")
list(LENGTH errors n_errors)
if(n_errors GREATER max_errors)
  message(FATAL_ERROR "${n_errors} errors (at most ${max_errors} expected):\n${out}")
endif()
message(STATUS "failed to compile as expected, ${n_errors} error(s)")

# cmake -DLINES=n -DMAX_LINES=m -P check_length.cmake: fails when the README quickstart grew past m lines.
if(LINES GREATER MAX_LINES)
  message(FATAL_ERROR "README.md quickstart has ${LINES} lines, more than the promised ${MAX_LINES}")
endif()
message(STATUS "README.md quickstart: ${LINES} lines (at most ${MAX_LINES})")

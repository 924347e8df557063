# CMake helpers that keep target declarations to a line or two (like Abseil's absl_cc_library).
#
#   kiln_cc_library(kiln_ops SRCS ops/ops.cc ... DEPS kiln_runtime)
#   kiln_cc_test(ops_test SRCS tests/ops_test.cc DEPS kiln_ops)

function(kiln_cc_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SRCS})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  target_compile_options(${name} PRIVATE ${KILN_WARNINGS})
endfunction()

function(kiln_cc_binary name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  target_compile_options(${name} PRIVATE ${KILN_WARNINGS})
endfunction()

# A GoogleTest binary whose cases ctest discovers one by one (so ctest reports real counts).
function(kiln_cc_test name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  kiln_cc_binary(${name} SRCS ${ARG_SRCS} DEPS ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endfunction()

# CMake helpers that keep target declarations to a line or two (like Abseil's absl_cc_library).
#
#   kiln_cc_library(kiln_ops SRCS ops/ops.cc ... CUDA_SRCS ops/cuda/matmul_cuda.cc ...
#                   DEPS kiln_runtime CUDA_LINK kiln::cuda_cupti)
#   kiln_cc_test(ops_test SRCS tests/ops_test.cc DEPS kiln_ops)
#
# kiln's own code includes headers by their path in the source tree ("ops/ops.h"); that include
# directory is private to kiln's targets. Users of the kiln::kiln target see the same headers as
# <kiln/ops/ops.h> instead (cmake/kiln_package.cmake), so no folder of kiln's clashes with theirs.
# DEPS are linked publicly; LINK_ONLY libraries are linked, but their headers (CUDA's) are not
# passed on: kiln's public headers do not need them.
# CUDA_SRCS and CUDA_LINK are the CUDA backend's part of a library, built only with
# KILN_WITH_CUDA; NO_CUDA_SRCS stand in for them in a build without CUDA (the entry points that
# code outside the backend reaches, answering that no GPU is there).

set(KILN_PRIVATE_INCLUDES ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/config)
if(KILN_WITH_CUDA)
  list(APPEND KILN_PRIVATE_INCLUDES ${CUDAToolkit_INCLUDE_DIRS})
endif()

function(kiln_cc_library name)
  cmake_parse_arguments(ARG "" "" "SRCS;CUDA_SRCS;NO_CUDA_SRCS;DEPS;LINK_ONLY;CUDA_LINK" ${ARGN})
  if(KILN_WITH_CUDA)
    add_library(${name} STATIC ${ARG_SRCS} ${ARG_CUDA_SRCS})
    target_link_libraries(${name} PRIVATE ${ARG_CUDA_LINK})
  else()
    add_library(${name} STATIC ${ARG_SRCS} ${ARG_NO_CUDA_SRCS})
  endif()
  target_include_directories(${name} PRIVATE ${KILN_PRIVATE_INCLUDES})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_LINK_ONLY})
  target_compile_options(${name} PRIVATE ${KILN_WARNINGS})
  string(REGEX REPLACE "^kiln_" "" export_name ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${export_name})  # kiln::ops, ...
  set_property(GLOBAL APPEND PROPERTY KILN_LIBRARIES ${name})
endfunction()

function(kiln_cc_binary name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SRCS})
  target_include_directories(${name} PRIVATE ${KILN_PRIVATE_INCLUDES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  target_compile_options(${name} PRIVATE ${KILN_WARNINGS})
endfunction()

# A GoogleTest binary whose cases ctest discovers one by one (so ctest reports real counts). In
# the sanitizer build each binary is one ctest entry instead: a process per case paid ASan's
# start-up ~2900 times (about 5 of CI's minutes); the binary's own summary gives the counts.
function(kiln_cc_test name)
  cmake_parse_arguments(ARG "" "" "SRCS;DEPS" ${ARGN})
  kiln_cc_binary(${name} SRCS ${ARG_SRCS} DEPS ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  if(KILN_SANITIZE)
    add_test(NAME ${name} COMMAND ${name} --gtest_brief=1)
    set_tests_properties(${name} PROPERTIES TIMEOUT 1500)
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
  endif()
endfunction()

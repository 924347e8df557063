# kiln as a package: the kiln::kiln target, the public headers as <kiln/...>, install rules and
# kilnConfig.cmake, so that a project uses kiln through find_package(kiln) or add_subdirectory
# and links one target:
#
#   find_package(kiln 0.1 REQUIRED)      # or add_subdirectory(path/to/kiln)
#   target_link_libraries(app PRIVATE kiln::kiln)
#   #include <kiln/kiln.h>
#
# Headers. Only the public ones (kiln.h and what it includes, see kiln_public_headers below) are
# given to users. kiln's sources include each other by their path in the source tree ("ops/ops.h").
# Rather than rewrite every include of the tree (and of every branch in flight), each header is
# copied at build time to ${PROJECT_BINARY_DIR}/include/kiln/<layer>/<file>.h with its kiln
# includes rewritten to "kiln/<layer>/<file>.h" (cmake/kiln_rewrite_header.cmake, a regex on
# '#include "<layer>/'). That tree is the only include directory kiln::kiln gives its users,
# from the build tree (add_subdirectory) and installed (find_package) alike: a user sees
# <kiln/...> only, and no ops/ or io/ folder of kiln's clashes with one of theirs. The source
# tree stays private to kiln's own targets (cmake/kiln.cmake). The copies are made at build
# time, from a glob checked at every build, so new and edited headers need no list kept here.
#
# Dependencies: kiln's libraries are static; the package finds what they need at link time
# (Abseil, Threads, and with CUDA the toolkit's cudart, NVRTC, cuBLASLt, CUPTI: kilnConfig.cmake;
# a package built without CUDA needs no toolkit at all). Public
# headers need Abseil's, never CUDA's (the CUDA libraries are linked but their include directory
# is not passed on), so a CPU-only user compiles without CUDA headers and needs no nvcc. The JSON
# parser (nlohmann_json) and DLPack's header are private to libkiln_io and not required.

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KILN_LAYERS runtime profiler ops ir passes codegen io models)
set(KILN_HEADER_ROOT ${PROJECT_BINARY_DIR}/include)
set(KILN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)

# The public header tree: kiln.h and every kiln header it includes, directly or through others
# (read from the sources at configure time; an edit of one of them configures again), plus
# with CUDA runtime/cuda_api.h for programs that call CUDA themselves. The other headers are kiln's own:
# neither in the build tree's include directory nor installed.
function(kiln_public_headers out)
  set(todo kiln.h)
  if(KILN_WITH_CUDA)
    list(APPEND todo runtime/cuda_api.h)
  endif()
  set(seen)
  while(todo)
    list(POP_FRONT todo header)
    if(header IN_LIST seen OR NOT EXISTS ${PROJECT_SOURCE_DIR}/${header})
      continue()  # (a generated header such as runtime/build_config.h is added below)
    endif()
    list(APPEND seen ${header})
    set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
                 ${PROJECT_SOURCE_DIR}/${header})
    file(STRINGS ${PROJECT_SOURCE_DIR}/${header} includes REGEX "^#include \"")
    foreach(line ${includes})
      string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" included "${line}")
      list(APPEND todo ${included})
    endforeach()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()
kiln_public_headers(kiln_headers)
string(REPLACE ";" "," kiln_layer_list "${KILN_LAYERS}")
set(kiln_generated_headers)
foreach(header ${kiln_headers})
  set(out ${KILN_HEADER_ROOT}/kiln/${header})
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DIN=${PROJECT_SOURCE_DIR}/${header} -DOUT=${out}
            -DLAYERS=${kiln_layer_list} -P ${PROJECT_SOURCE_DIR}/cmake/kiln_rewrite_header.cmake
    DEPENDS ${PROJECT_SOURCE_DIR}/${header} ${PROJECT_SOURCE_DIR}/cmake/kiln_rewrite_header.cmake
    VERBATIM)
  list(APPEND kiln_generated_headers ${out})
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${out} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/${dir})
endforeach()
# How kiln was built (CMakeLists.txt generates it from cmake/build_config.h.in).
configure_file(${PROJECT_BINARY_DIR}/config/runtime/build_config.h
               ${KILN_HEADER_ROOT}/kiln/runtime/build_config.h COPYONLY)
install(FILES ${KILN_HEADER_ROOT}/kiln/runtime/build_config.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/runtime)
add_custom_target(kiln_headers ALL DEPENDS ${kiln_generated_headers})

# kiln::kiln: every layer, and the <kiln/...> headers.
add_library(kiln INTERFACE)
add_library(kiln::kiln ALIAS kiln)
target_link_libraries(kiln INTERFACE kiln_codegen kiln_io kiln_models)
target_include_directories(kiln INTERFACE $<BUILD_INTERFACE:${KILN_HEADER_ROOT}>
                                          $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(kiln INTERFACE cxx_std_20)
add_dependencies(kiln kiln_headers)  # followed by users of the interface target
set_target_properties(kiln_absl PROPERTIES EXPORT_NAME absl_deps)

get_property(kiln_libraries GLOBAL PROPERTY KILN_LIBRARIES)
install(TARGETS kiln kiln_absl ${kiln_libraries} EXPORT kilnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_INSTALL_CMAKEDIR})
configure_package_config_file(cmake/kilnConfig.cmake.in ${PROJECT_BINARY_DIR}/kilnConfig.cmake
                              INSTALL_DESTINATION ${KILN_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kilnConfig.cmake ${PROJECT_BINARY_DIR}/kilnConfigVersion.cmake
        DESTINATION ${KILN_INSTALL_CMAKEDIR})
if(KILN_WITH_CUDA)
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/kiln_cuda_libs.cmake DESTINATION ${KILN_INSTALL_CMAKEDIR})
endif()

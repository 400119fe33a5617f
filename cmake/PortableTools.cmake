# fsdp-opt and fsdp-translate without libLLVM.so, for machines that have no
# LLVM (the GPU hosts). Debian's static MLIR targets name libLLVM.so (the
# imported target `LLVM`) as their dependency, and LLVMConfig asks for the
# dylib; both are redirected to LLVM's static archives, linked as one group
# because they depend on each other in cycles. Only the members the tools
# use are pulled in; --as-needed drops the shared libraries LLVMSupport
# names but the tools never call (z3), and zlib and the C++ runtime are
# linked statically, so what remains is glibc and libzstd.so.1.
set(LLVM_LINK_LLVM_DYLIB OFF)
file(GLOB FSDP_LLVM_ARCHIVES ${LLVM_LIBRARY_DIR}/libLLVM*.a)
if(NOT FSDP_LLVM_ARCHIVES)
  message(FATAL_ERROR "FSDP_PORTABLE_TOOLS needs LLVM's static archives in ${LLVM_LIBRARY_DIR} "
                      "(Debian: llvm-22-dev)")
endif()
find_library(FSDP_ZLIB_STATIC libz.a REQUIRED)
find_library(FSDP_ZSTD_SHARED NAMES libzstd.so.1 libzstd.so REQUIRED)
# LLVMSupport's static target names these two; LLVMConfig defines them only
# for static LLVM builds, which Debian's is not.
foreach(name ZLIB::ZLIB zstd::libzstd_shared)
  if(NOT TARGET ${name})
    add_library(${name} INTERFACE IMPORTED)
  endif()
endforeach()
set_target_properties(ZLIB::ZLIB PROPERTIES INTERFACE_LINK_LIBRARIES ${FSDP_ZLIB_STATIC})
set_target_properties(zstd::libzstd_shared PROPERTIES INTERFACE_LINK_LIBRARIES ${FSDP_ZSTD_SHARED})

add_library(FsdpStaticLLVM INTERFACE)
target_link_libraries(FsdpStaticLLVM INTERFACE "$<LINK_GROUP:RESCAN,${FSDP_LLVM_ARCHIVES}>"
                      ${FSDP_ZLIB_STATIC} ${FSDP_ZSTD_SHARED})
target_link_options(FsdpStaticLLVM INTERFACE -Wl,--as-needed -static-libstdc++ -static-libgcc)

get_directory_property(FSDP_IMPORTED_TARGETS IMPORTED_TARGETS)
foreach(target IN LISTS FSDP_IMPORTED_TARGETS)
  get_target_property(dependencies ${target} INTERFACE_LINK_LIBRARIES)
  if(dependencies AND "LLVM" IN_LIST dependencies)
    list(TRANSFORM dependencies REPLACE "^LLVM$" "FsdpStaticLLVM")
    set_target_properties(${target} PROPERTIES INTERFACE_LINK_LIBRARIES "${dependencies}")
  endif()
endforeach()

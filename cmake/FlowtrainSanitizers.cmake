# FLOWTRAIN_SANITIZE=address builds everything with AddressSanitizer + UndefinedBehaviorSanitizer,
# FLOWTRAIN_SANITIZE=thread with ThreadSanitizer. Set at configure time for the whole tree.
if(FLOWTRAIN_SANITIZE STREQUAL "address")
  # vptr is off: oneTBB's flow graph builds tasks in place through a downcast that UBSan's vptr
  # check flags before the object exists (a false positive inside TBB's headers).
  set(_flowtrain_san -fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer
                     -fno-sanitize-recover=all)
elseif(FLOWTRAIN_SANITIZE STREQUAL "thread")
  set(_flowtrain_san -fsanitize=thread -fno-omit-frame-pointer)
  # TSan only sees synchronization in instrumented code: against an uninstrumented libtbb (the
  # system's) it misses the task scheduler's happens-before edges and reports hundreds of false
  # races. `make sanitize-thread` builds an instrumented one (scripts/build-tsan-tbb) and sets TBB_DIR.
  if(TBB_DIR MATCHES "^/usr/")
    message(WARNING "FLOWTRAIN_SANITIZE=thread with the system oneTBB (${TBB_DIR}), which is not "
                    "built with ThreadSanitizer: expect false race reports from its scheduler. "
                    "Use `make sanitize-thread`, or -DTBB_DIR=<prefix>/lib/cmake/TBB of a oneTBB "
                    "built by scripts/build-tsan-tbb.")
  endif()
elseif(NOT FLOWTRAIN_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FLOWTRAIN_SANITIZE must be empty, 'address' or 'thread', not '${FLOWTRAIN_SANITIZE}'")
endif()
if(_flowtrain_san)
  add_compile_options(${_flowtrain_san})
  add_link_options(${_flowtrain_san})
endif()

# FLOWTRAIN_SANITIZE=address builds everything with AddressSanitizer + UndefinedBehaviorSanitizer,
# FLOWTRAIN_SANITIZE=thread with ThreadSanitizer. Set at configure time for the whole tree.
if(FLOWTRAIN_SANITIZE STREQUAL "address")
  # vptr is off: oneTBB's flow graph builds tasks in place through a downcast that UBSan's vptr
  # check flags before the object exists (a false positive inside TBB's headers).
  set(_flowtrain_san -fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer
                     -fno-sanitize-recover=all)
elseif(FLOWTRAIN_SANITIZE STREQUAL "thread")
  set(_flowtrain_san -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT FLOWTRAIN_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FLOWTRAIN_SANITIZE must be empty, 'address' or 'thread', not '${FLOWTRAIN_SANITIZE}'")
endif()
if(_flowtrain_san)
  add_compile_options(${_flowtrain_san})
  add_link_options(${_flowtrain_san})
endif()

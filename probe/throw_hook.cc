// Temporary: prints a backtrace when std::out_of_range is thrown.
#include <dlfcn.h>
#include <execinfo.h>
#include <cstring>
#include <typeinfo>
extern "C" void __cxa_throw(void* e, std::type_info* t, void (*d)(void*)) {
  using Throw = void (*)(void*, std::type_info*, void (*)(void*));
  static Throw real = reinterpret_cast<Throw>(dlsym(RTLD_NEXT, "__cxa_throw"));
  if (t && std::strstr(t->name(), "out_of_range")) {
    void* frames[64];
    int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, 2);
  }
  real(e, t, d);
  __builtin_unreachable();
}

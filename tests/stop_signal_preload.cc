// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// LD_PRELOADed into `dedup worker` by tests/worker_stop_signal_test.sh, to make
// a race of its SIGTERM handler certain: a second signal whose handler finds the
// Consumer still there while the main thread returns from Run() and destroys it.
//
// It starts one thread of its own (its TID written to $STOP_SIGNAL_TID_FILE)
// that only waits, so that the test can send a signal that runs its handler
// there (kill(2) of a thread's TID picks that thread first). A sem_post(3) made
// on that thread (the handler's wake-up) is held for 2 s (said on stderr). If the
// semaphore of a held post is destroyed meanwhile (sem_destroy(3): the Consumer
// is going while the handler is still inside its Stop()), this prints why on
// stderr and ends the process with exit code 86, before anything touches freed
// memory. Every call passes on to the C library's. The variables are removed
// from the environment at start, so the worker's handlers do not load it.

#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace {

using SemFn = int (*)(sem_t*);
SemFn real_post;
SemFn real_destroy;
std::atomic<pid_t> idle_tid{0};
std::atomic<sem_t*> held{nullptr};

void* Idle(void* path) {
  idle_tid.store(gettid());
  if (FILE* f = std::fopen(static_cast<const char*>(path), "w")) {
    std::fprintf(f, "%d\n", static_cast<int>(gettid()));
    std::fclose(f);
  }
  std::free(path);
  for (;;) pause();
  return nullptr;
}

__attribute__((constructor)) void Start() {
  real_post = reinterpret_cast<SemFn>(dlsym(RTLD_NEXT, "sem_post"));
  real_destroy = reinterpret_cast<SemFn>(dlsym(RTLD_NEXT, "sem_destroy"));
  const char* path = std::getenv("STOP_SIGNAL_TID_FILE");
  if (path == nullptr) return;
  char* copy = strdup(path);
  unsetenv("STOP_SIGNAL_TID_FILE");
  unsetenv("LD_PRELOAD");
  pthread_t t;
  if (pthread_create(&t, nullptr, Idle, copy) == 0) pthread_detach(t);
}

}  // namespace

extern "C" int sem_post(sem_t* sem) {
  const pid_t idle = idle_tid.load();
  if (idle != 0 && gettid() == idle) {
    // Only async-signal-safe calls here: this runs in a signal handler.
    static const char msg[] = "stop_signal_preload: holding a signal handler's sem_post for 2 s\n";
    (void)!write(2, msg, sizeof msg - 1);
    held.store(sem);
    const timespec step = {0, 1'000'000};
    for (int i = 0; i < 2000; ++i) nanosleep(&step, nullptr);
    held.store(nullptr);
  }
  return real_post(sem);
}

extern "C" int sem_destroy(sem_t* sem) {
  if (sem != nullptr && held.load() == sem) {
    static const char msg[] =
        "stop_signal_preload: sem_destroy of a semaphore whose sem_post from a signal "
        "handler is still held: the Consumer is destroyed while the handler is inside "
        "its Stop()\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(86);
  }
  return real_destroy(sem);
}

/* A stand-in for the CUDA driver (tests/test_cuda_fork.py): its fork semantics only.
 *
 * The real driver cannot be used in a process forked from one that initialised it: there cuInit
 * returns CUDA_ERROR_NOT_INITIALIZED (3), as does every other call. Before cuInit,
 * cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED too (what the harness's probe asks);
 * cuDriverGetVersion answers whenever. Built with -Wl,-soname,libcuda.so.1, found through
 * LD_LIBRARY_PATH as the real one is. Every cuInit is logged as "PID cuInit CODE" to the file
 * STANDIN_CUDA_LOG names, if it names one; STANDIN_CUDA_DEVICES sets the device count (default 1). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_INITIALIZED 3

static pid_t initialised_by = 0; /* the process whose cuInit succeeded; a fork inherits it */

static void note(const char *call, int code) {
    const char *path = getenv("STANDIN_CUDA_LOG");
    if (path == NULL || *path == '\0')
        return;
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0)
        return;
    char line[80];
    int n = snprintf(line, sizeof line, "%d %s %d\n", (int)getpid(), call, code);
    if (n > 0 && write(fd, line, (size_t)n) < 0) { /* nothing to do: the log is best effort */ }
    close(fd);
}

int cuInit(unsigned int flags) {
    (void)flags;
    int code = CUDA_SUCCESS;
    if (initialised_by == 0)
        initialised_by = getpid();
    else if (initialised_by != getpid())
        code = CUDA_ERROR_NOT_INITIALIZED; /* inherited across fork: unusable here */
    note("cuInit", code);
    return code;
}

int cuDeviceGetCount(int *count) {
    if (initialised_by != getpid())
        return CUDA_ERROR_NOT_INITIALIZED;
    const char *devices = getenv("STANDIN_CUDA_DEVICES");
    *count = devices ? atoi(devices) : 1;
    return CUDA_SUCCESS;
}

int cuDriverGetVersion(int *version) {
    *version = 12040;
    return CUDA_SUCCESS;
}

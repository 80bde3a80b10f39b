/* One binary for images that have nothing else: no shell, no Python, maybe no libc of glibc's.
 *
 *   probe cat              stdin to stdout, byte for byte
 *   probe say OUT ERR      OUT on stdout, ERR on stderr
 *   probe exit N           exit with N
 *   probe sleep SECONDS
 *   probe hog              touch memory until the kernel says no
 *   probe tty              exit 0 when stdin is a terminal
 *   probe syscalls         one line per probe: NAME ok|errno text
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static const struct { const char *name; long nr; long a[6]; } PROBES[] = {
    {"unshare", SYS_unshare, {0}},
    {"mount", SYS_mount, {0}},
    {"ptrace", SYS_ptrace, {0}},
    {"keyctl", SYS_keyctl, {0, -3}},
    {"bpf", SYS_bpf, {0}},
    {"io_uring_setup", 425, {1, 0}},
    {"clock_settime", SYS_clock_settime, {0}},
    {"sethostname", SYS_sethostname, {0}},
    {"clone3", 435, {0}},
};

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    if (!strcmp(what, "cat")) {
        static char buf[1 << 16];
        ssize_t n;
        while ((n = read(0, buf, sizeof buf)) > 0)
            for (ssize_t off = 0; off < n;) {
                ssize_t w = write(1, buf + off, n - off);
                if (w < 0) return 1;
                off += w;
            }
        return n < 0;
    }
    if (!strcmp(what, "say") && argc > 3) {
        dprintf(1, "%s\n", argv[2]);
        dprintf(2, "%s\n", argv[3]);
        return 0;
    }
    if (!strcmp(what, "exit") && argc > 2) return atoi(argv[2]);
    if (!strcmp(what, "sleep") && argc > 2) { sleep(atoi(argv[2])); return 0; }
    if (!strcmp(what, "tty")) return isatty(0) ? 0 : 1;
    if (!strcmp(what, "hog")) {
        for (;;) {
            char *p = malloc(1 << 20);
            if (!p) return 3;
            memset(p, 1, 1 << 20);
        }
    }
    if (!strcmp(what, "syscalls")) {
        for (size_t i = 0; i < sizeof PROBES / sizeof *PROBES; i++) {
            errno = 0;
            long r = syscall(PROBES[i].nr, PROBES[i].a[0], PROBES[i].a[1], PROBES[i].a[2], PROBES[i].a[3], PROBES[i].a[4], PROBES[i].a[5]);
            printf("%s %s\n", PROBES[i].name, r >= 0 ? "ok" : strerror(errno));
        }
        return 0;
    }
    fprintf(stderr, "probe: cat | say OUT ERR | exit N | sleep S | hog | tty | syscalls\n");
    return 2;
}

/* The native init of a one-shot box: what guest/init.py does for a box whose command needs nothing but itself
 * (no terminal, no egress, no agent, no execs beside it), without an interpreter's start (~7 ms of CPU a box).
 *
 * As init.py: it connects the lifeline (the host's socket) and says hello, saying it serves no execs; runs the
 * command (posix_spawnp, as Python's posix.posix_spawnp: the environment as it came, the signals the terminal sends
 * and SIGPIPE/SIGXFSZ at their defaults, nothing blocked); passes SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and
 * SIGUSR2 on to it; reaps every orphan (it is the box's PID 1); exits with the command's status, 128+N for a
 * signal's death, 127 or 126 with quinebox's line when it cannot be run. A lifeline that breaks (the host died,
 * even by SIGKILL) kills every process of the box, and the init exits 137; a command that died of SIGKILL is told
 * to the host, which is waited for up to 2 s (its memory cgroup's OOM count is read while the box stands).
 *
 * Runs inside untrusted boxes of any image: static (musl), no allocation, no state; the policy that picks it
 * (box/policy.py's init_command) gives anything else to init.py. Built at image build (images/agent_image.py) into
 * the guest runtime as /.quinebox/bin/init; where no C compiler is, there is none and init.py runs every box.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define HOST_SOCKET "/run/quinebox/host.sock"
/* Frames as guest/protocol.py writes them: a 4-byte big-endian length, 4 bytes of flags (none), the JSON. */
#define HELLO "{\"kind\":\"hello\",\"role\":\"lifeline\",\"serves\":[]}"
#define KILLED "{\"kind\":\"killed\"}"
#define KILLED_WAIT_MS 2000

static const int FORWARDED[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
static const int DEFAULTED[] = {SIGPIPE, SIGXFSZ, SIGINT, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void say(const char *format, ...) {
    char line[1024];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(line, sizeof line, format, args);
    va_end(args);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof line)
        n = sizeof line - 1;
    ssize_t written = write(2, line, (size_t)n);
    (void)written;
}

static void kill_everything(void) {
    kill(-1, SIGKILL);
    _exit(137);
}

static int send_frame(int fd, const char *json) {
    size_t n = strlen(json);
    char frame[128];
    if (n + 8 > sizeof frame)
        return -1;
    frame[0] = (char)(n >> 24), frame[1] = (char)(n >> 16), frame[2] = (char)(n >> 8), frame[3] = (char)n;
    memset(frame + 4, 0, 4);
    memcpy(frame + 8, json, n);
    return send(fd, frame, n + 8, MSG_NOSIGNAL) == (ssize_t)(n + 8) ? 0 : -1;
}

/* Whatever the host says, read and dropped; its end (or an error) ends the box. */
static void heard(int lifeline) {
    char sink[4096];
    ssize_t got = recv(lifeline, sink, sizeof sink, MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR))
        kill_everything();
}

static int status_of(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv) {
    int first = argc > 1 && strcmp(argv[1], "--") == 0 ? 2 : 1;
    if (first >= argc) {
        say("quinebox: lifeline: no command given\n");
        return 125;
    }
    char **command = argv + first;

    int lifeline = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un host = {.sun_family = AF_UNIX, .sun_path = HOST_SOCKET};
    if (lifeline < 0 || connect(lifeline, (struct sockaddr *)&host, sizeof host) < 0) {
        say("quinebox: the host is gone; not starting\n");
        return 137;
    }
    if (send_frame(lifeline, HELLO) < 0)
        kill_everything();

    /* Every signal passed on, and each child's end, is read from a signalfd: blocked, they wait there, even one that
     * comes before the command runs (it is passed on as soon as it does), and even to the namespace's PID 1. */
    sigset_t watched;
    sigemptyset(&watched);
    for (size_t i = 0; i < COUNT(FORWARDED); i++)
        sigaddset(&watched, FORWARDED[i]);
    sigaddset(&watched, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &watched, NULL) < 0)
        kill_everything();
    int signals = signalfd(-1, &watched, SFD_CLOEXEC);
    if (signals < 0)
        kill_everything();

    posix_spawnattr_t attr;
    sigset_t none, defaulted;
    sigemptyset(&none);
    sigemptyset(&defaulted);
    for (size_t i = 0; i < COUNT(DEFAULTED); i++)
        sigaddset(&defaulted, DEFAULTED[i]);
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setsigdefault(&attr, &defaulted);
    posix_spawnattr_setsigmask(&attr, &none);
    pid_t child;
    int failed = posix_spawnp(&child, command[0], NULL, &attr, command, environ);
    posix_spawnattr_destroy(&attr);
    if (failed == ENOENT) {
        say("quinebox: %s: command not found\n", command[0]);
        return 127;
    }
    if (failed) {
        say("quinebox: %s: cannot execute: %s\n", command[0], strerror(failed));
        return 126;
    }

    struct pollfd ready[2] = {{.fd = signals, .events = POLLIN}, {.fd = lifeline, .events = POLLIN}};
    for (;;) {
        if (poll(ready, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            kill_everything();
        }
        if (ready[1].revents)
            heard(lifeline);
        if (!ready[0].revents)
            continue;
        struct signalfd_siginfo info;
        if (read(signals, &info, sizeof info) != sizeof info)
            continue;
        if ((int)info.ssi_signo != SIGCHLD) {
            kill(child, (int)info.ssi_signo);
            continue;
        }
        int status, reaped, ended = 0;
        for (pid_t pid; (pid = waitpid(-1, &reaped, WNOHANG)) > 0;) /* orphans too: this is the box's PID 1 */
            if (pid == child)
                ended = 1, status = reaped;
        if (!ended)
            continue;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL && send_frame(lifeline, KILLED) == 0) {
            struct pollfd word = {.fd = lifeline, .events = POLLIN};
            poll(&word, 1, KILLED_WAIT_MS);
        }
        return status_of(status);
    }
}

/* quinebox-boxstart: what each bwrap box's start execs before bwrap (quinebox/box/backends/bwrap/box.py's `_wrapped`).
 *
 *   quinebox-boxstart [--rlimit=NAME=SOFT:HARD]... [--ids=UID:GID] -- PROGRAM [ARG]...
 *
 * It sets each rlimit on itself (bwrap, which it becomes, and so the box inherit them), then with --ids (root) becomes
 * UID and GID in every id the kernel keeps, with no supplementary group (the kernel clears every capability as the
 * last uid 0 goes), then execs PROGRAM. That is what util-linux's prlimit and setpriv did before bwrap: two execs of
 * dynamically linked programs, ~2.5 ms of every box's start on this machine, against ~0.1 ms for this, linked static.
 * Limits are set on itself, never on another process: that would need CAP_SYS_RESOURCE, which a container's root (this
 * machine's included) may lack; a hard limit above the caller's own needs it still, as for prlimit.
 *
 * Any failure is one line on stderr and exit 125, before PROGRAM runs (127 when PROGRAM cannot be run). No setuid bit,
 * no state: it runs as whoever starts the box. scripts/setup.sh builds it into the venv beside the interpreter; where it
 * is not (no C compiler, a wheel's install), box.py runs prlimit and setpriv as before.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static const struct {
    const char *name;
    int resource;
} LIMITS[] = {
    {"as", RLIMIT_AS},           {"core", RLIMIT_CORE},       {"cpu", RLIMIT_CPU},         {"data", RLIMIT_DATA},
    {"fsize", RLIMIT_FSIZE},     {"locks", RLIMIT_LOCKS},     {"memlock", RLIMIT_MEMLOCK}, {"msgqueue", RLIMIT_MSGQUEUE},
    {"nice", RLIMIT_NICE},       {"nofile", RLIMIT_NOFILE},   {"nproc", RLIMIT_NPROC},     {"rss", RLIMIT_RSS},
    {"rtprio", RLIMIT_RTPRIO},   {"rttime", RLIMIT_RTTIME},   {"sigpending", RLIMIT_SIGPENDING}, {"stack", RLIMIT_STACK},
};

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "quinebox: cannot start the box: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    return 125;
}

/* A whole decimal number up to `max`, nothing before or after it. */
static int number(const char *text, const char *end, unsigned long long max, unsigned long long *out) {
    if (text == end || end - text > 20)
        return -1;
    unsigned long long value = 0;
    for (const char *c = text; c < end; c++) {
        if (*c < '0' || *c > '9' || value > (max - (unsigned long long)(*c - '0')) / 10)
            return -1;
        value = value * 10 + (unsigned long long)(*c - '0');
    }
    *out = value;
    return 0;
}

static int set_limit(const char *spec) {
    const char *eq = strchr(spec, '='), *colon = eq ? strchr(eq, ':') : NULL;
    if (!eq || !colon)
        return fail("not NAME=SOFT:HARD", spec);
    int resource = -1;
    for (size_t i = 0; i < sizeof LIMITS / sizeof LIMITS[0]; i++)
        if (strlen(LIMITS[i].name) == (size_t)(eq - spec) && strncmp(spec, LIMITS[i].name, (size_t)(eq - spec)) == 0)
            resource = LIMITS[i].resource;
    unsigned long long soft, hard;
    if (resource < 0)
        return fail("no such rlimit", spec);
    if (number(eq + 1, colon, RLIM_INFINITY - 1, &soft) || number(colon + 1, colon + strlen(colon), RLIM_INFINITY - 1, &hard) || soft > hard)
        return fail("not NAME=SOFT:HARD with SOFT <= HARD", spec);
    struct rlimit limit = {(rlim_t)soft, (rlim_t)hard};
    if (setrlimit(resource, &limit) != 0)
        return fail(spec, strerror(errno));
    return 0;
}

static int become(const char *spec) {
    const char *colon = strchr(spec, ':');
    unsigned long long uid, gid;
    if (!colon || number(spec, colon, 0xFFFFFFFEULL, &uid) || number(colon + 1, colon + strlen(colon), 0xFFFFFFFEULL, &gid))
        return fail("not --ids=UID:GID", spec);
    if (setgroups(0, NULL) != 0 || setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0 || setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0)
        return fail("becoming the box's host ids", strerror(errno));
    uid_t r, e, s;
    gid_t rg, eg, sg;
    if (getresuid(&r, &e, &s) != 0 || getresgid(&rg, &eg, &sg) != 0 || r != uid || e != uid || s != uid || rg != gid || eg != gid || sg != gid ||
        getgroups(0, NULL) != 0)
        return fail("becoming the box's host ids", "the kernel kept another id");
    return 0;
}

int main(int argc, char **argv) {
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        int failed;
        if (strncmp(argv[i], "--rlimit=", 9) == 0)
            failed = set_limit(argv[i] + 9);
        else if (strncmp(argv[i], "--ids=", 6) == 0)
            failed = become(argv[i] + 6);
        else
            failed = fail("an option quinebox-boxstart does not know", argv[i]);
        if (failed)
            return failed;
    }
    if (i + 1 >= argc)
        return fail("no program after --", NULL);
    execv(argv[i + 1], argv + i + 1);
    fprintf(stderr, "quinebox: cannot run %s: %s\n", argv[i + 1], strerror(errno));
    return 127;
}

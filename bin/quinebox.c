/* The `quinebox` command's native thin client: quinebox/client.py's fast path without an interpreter's start.
 *
 * A served `quinebox exec -- true` spent ~12 ms of CPU starting Python to hand argv, cwd, the environment, the umask
 * and its stdio to the command server; this does the same in well under a millisecond, as Mercurial's chg does for hg.
 * scripts/setup.sh builds it into the venv as `quinebox`, the Python script beside it as `quinebox-py`.
 *
 * It handles only the path where a server of this user's answers: for `exec`, `run`, `map`, `batch` and `shell`, with
 * QUINEBOX_SERVE unset, `auto` or `manual`, a state dir and run dir of this user's that no one else may write, and a
 * socket there that answers as this user (SO_PEERCRED, read before a byte is sent). It sends the frame client.py sends
 * (fdpass.py: a 4-byte big-endian length, then marshal data; the descriptors with its first bytes), forwards the same
 * signals, and exits with the status the server reports. Anything else (no server, another mode, a state dir to refuse,
 * text that is not UTF-8, a server that hands the command back) is the Python client's, exec'd with argv unchanged:
 * it says what is wrong, starts a server, or runs the command in-process, exactly as before. A command handed back
 * unrun tells it why in QUINEBOX_HANDED (`stale` or `confined`), so it does not ask again; a socket another user's
 * process answers on, `foreign:UID`, which it says in one line before it runs the command in-process.
 *
 * QB_PYTHON and QB_SCRIPT, the interpreter and the Python client's script, are given when it is built.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef QB_PYTHON
#error "build with -DQB_PYTHON='\"/path/to/python\"' -DQB_SCRIPT='\"/path/to/quinebox-py\"' (scripts/setup.sh does)"
#endif

#define EXIT_QUINEBOX 125
#define MAX_FRAME (4u << 20)
#define SERVE_SOCKET "serve.2.sock"

extern char **environ;

static char **given;  /* main's argv, for the Python client */
static int server = -1;
static volatile sig_atomic_t forwarded;  /* the first signal passed on, SIGWINCH aside */
static const int FORWARDED[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH, SIGUSR1, SIGUSR2};
#define NFORWARDED (sizeof FORWARDED / sizeof FORWARDED[0])

/* The Python client, with our argv; `handed`: why the server gave the command back, if it did. */
static void python(const char *handed) {
    if (handed)
        setenv("QUINEBOX_HANDED", handed, 1);
    size_t n = 0;
    while (given[n])
        n++;
    char **argv = calloc(n + 3, sizeof(char *));
    if (argv) {
        argv[0] = QB_PYTHON;
        argv[1] = QB_SCRIPT;
        for (size_t i = 1; i < n; i++)
            argv[i + 1] = given[i];
        execv(QB_PYTHON, argv);
    }
    dprintf(2, "quinebox: cannot run %s: %s (scripts/setup.sh builds this client beside it)\n", QB_PYTHON, strerror(errno));
    _exit(EXIT_QUINEBOX);
}

/* -- marshal, as Python's marshal.dumps writes what client.py sends, and reads what the server answers -- */

struct buffer {
    unsigned char *data;
    size_t size, cap;
    int failed;
};

static void put(struct buffer *b, const void *bytes, size_t n) {
    if (b->failed)
        return;
    if (b->size + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->size + n)
            cap *= 2;
        unsigned char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->size, bytes, n);
    b->size += n;
}

static void put_i32(struct buffer *b, uint32_t value) {
    unsigned char le[4] = {value & 0xff, (value >> 8) & 0xff, (value >> 16) & 0xff, (value >> 24) & 0xff};
    put(b, le, 4);
}

/* Whether `s` is UTF-8 as Python decodes it strictly: no overlong forms, no surrogates, nothing past U+10FFFF. */
static int utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t more;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf)
            more = 1, cp = c & 0x1fu;
        else if ((c & 0xf0) == 0xe0)
            more = 2, cp = c & 0x0fu;
        else if (c >= 0xf0 && c <= 0xf4)
            more = 3, cp = c & 0x07u;
        else
            return 0;
        if (n - i <= more)
            return 0;
        for (size_t k = 1; k <= more; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = cp << 6 | (s[i + k] & 0x3fu);
        }
        if ((more == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (more == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += more + 1;
    }
    return 1;
}

/* A str (TYPE_UNICODE); 0 when it is not UTF-8, which the Python client then sends as it always has. */
static int put_str(struct buffer *b, const char *s, size_t n) {
    if (n > 0x7fffffff || !utf8((const unsigned char *)s, n))
        return 0;
    put(b, "u", 1);
    put_i32(b, (uint32_t)n);
    put(b, s, n);
    return 1;
}

static int put_key(struct buffer *b, const char *key) { return put_str(b, key, strlen(key)); }

static void put_int(struct buffer *b, int32_t value) {
    put(b, "i", 1);
    put_i32(b, (uint32_t)value);
}

/* A frame's 4-byte big-endian length, over the placeholder it began with: 0 when it failed or is too long. */
static int seal(struct buffer *b) {
    if (b->failed || b->size - 4 > MAX_FRAME)
        return 0;
    uint32_t size = (uint32_t)(b->size - 4);
    unsigned char be[4] = {size >> 24, (size >> 16) & 0xff, (size >> 8) & 0xff, size & 0xff};
    memcpy(b->data, be, 4);
    return 1;
}

/* {"kind": "run", "argv": [...], "cwd": ..., "env": {...}, "umask": N}: 0 when something in it is not UTF-8. */
static int run_frame(struct buffer *b, char **argv, const char *cwd, mode_t umask_now) {
    put(b, "\0\0\0\0", 4); /* the length, set below */
    put(b, "{", 1);
    int ok = put_key(b, "kind") && put_key(b, "run") && put_key(b, "argv");
    size_t n = 0;
    while (argv[n])
        n++;
    put(b, "[", 1);
    put_i32(b, (uint32_t)n);
    for (size_t i = 0; ok && i < n; i++)
        ok = put_key(b, argv[i]);
    ok = ok && put_key(b, "cwd") && put_key(b, cwd) && put_key(b, "env");
    put(b, "{", 1);
    for (char **entry = environ; ok && *entry; entry++) {
        const char *eq = strchr(*entry, '=');
        if (!eq || eq == *entry)
            continue; /* os.environ skips these */
        size_t klen = (size_t)(eq - *entry);
        int seen = 0; /* os.environ keeps a name's first value */
        for (char **earlier = environ; earlier < entry && !seen; earlier++)
            seen = strncmp(*earlier, *entry, klen + 1) == 0;
        if (!seen)
            ok = put_str(b, *entry, klen) && put_key(b, eq + 1);
    }
    put(b, "0", 1);
    ok = ok && put_key(b, "umask");
    put_int(b, (int32_t)umask_now);
    put(b, "0", 1);
    return ok && seal(b);
}

/* {"kind": "signal", "signal": N}, made once before a handler can run: the handler sets only N's byte (at
   `signal_byte`), so it neither allocates nor encodes. */
static struct buffer signal_frame;
static size_t signal_byte;

static int make_signal_frame(struct buffer *b) {
    put(b, "\0\0\0\0", 4);
    put(b, "{", 1);
    int ok = put_key(b, "kind") && put_key(b, "signal") && put_key(b, "signal");
    put_int(b, 0);
    signal_byte = b->size - 4; /* the int's low byte: every signal number fits it */
    put(b, "0", 1);
    return ok && seal(b);
}

/* What an answer says: its "kind" (a str) and its "code" (an int), when it is a dict marshal loads. */
struct answer {
    char kind[16];
    long code;
    int has_code, entries, ok;
};

struct reader {
    const unsigned char *p, *end;
    /* objects marshal flagged for reference, in order: a str's bytes, or an int */
    struct { const unsigned char *s; size_t n; long value; int is_str, is_int; } refs[256];
    size_t nrefs;
    int failed;
};

struct value {
    const unsigned char *s;
    size_t n;
    long i;
    int is_str, is_int;
};

static uint32_t get_i32(struct reader *r) {
    if (r->end - r->p < 4) {
        r->failed = 1;
        return 0;
    }
    uint32_t v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
    r->p += 4;
    return v;
}

static int skip(struct reader *r, size_t n) {
    if ((size_t)(r->end - r->p) < n)
        return r->failed = 1, 0;
    r->p += n;
    return 1;
}

/* One object of marshal's format (any, its containers' items skipped), into `out` when it is a str or an int. */
static void read_value(struct reader *r, struct value *out, int depth, int *is_null) {
    memset(out, 0, sizeof *out);
    if (is_null)
        *is_null = 0;
    if (r->failed || r->p >= r->end || depth > 32) {
        r->failed = 1;
        return;
    }
    unsigned char code = *r->p++;
    int flagged = code & 0x80;
    size_t slot = r->nrefs;
    if (flagged) {
        if (r->nrefs >= sizeof r->refs / sizeof r->refs[0])
            return (void)(r->failed = 1);
        memset(&r->refs[r->nrefs++], 0, sizeof r->refs[0]);
    }
    struct value item;
    switch (code & 0x7f) {
    case '0':
        if (is_null)
            *is_null = 1;
        else
            r->failed = 1;
        return;
    case 'N': case 'T': case 'F': case 'S': case '.':
        break;
    case 'i':
        out->i = (int32_t)get_i32(r);
        out->is_int = 1;
        break;
    case 'l': {
        int32_t digits = (int32_t)get_i32(r);
        skip(r, (size_t)(digits < 0 ? -(int64_t)digits : digits) * 2);
        break;
    }
    case 'g': skip(r, 8); break;
    case 'y': skip(r, 16); break;
    case 'u': case 't': case 'a': case 'A': case 's': {
        uint32_t n = get_i32(r);
        out->s = r->p;
        out->n = n;
        out->is_str = (code & 0x7f) != 's';
        skip(r, n);
        break;
    }
    case 'z': case 'Z': {
        if (r->p >= r->end)
            return (void)(r->failed = 1);
        size_t n = *r->p++;
        out->s = r->p;
        out->n = n;
        out->is_str = 1;
        skip(r, n);
        break;
    }
    case ')': case '(': case '[': case '<': case '>': {
        size_t n = (code & 0x7f) == ')' ? (r->p < r->end ? *r->p++ : (r->failed = 1, 0)) : get_i32(r);
        for (size_t i = 0; i < n && !r->failed; i++)
            read_value(r, &item, depth + 1, NULL);
        break;
    }
    case '{': {
        int end = 0;
        while (!r->failed) {
            read_value(r, &item, depth + 1, &end);
            if (end)
                break;
            read_value(r, &item, depth + 1, NULL);
        }
        break;
    }
    case 'r': {
        uint32_t index = get_i32(r);
        if (index >= r->nrefs)
            return (void)(r->failed = 1);
        out->s = r->refs[index].s;
        out->n = r->refs[index].n;
        out->i = r->refs[index].value;
        out->is_str = r->refs[index].is_str;
        out->is_int = r->refs[index].is_int;
        break;
    }
    default: /* code objects and the rest: never in a frame of ours */
        r->failed = 1;
        return;
    }
    if (flagged && !r->failed) {
        r->refs[slot].s = out->s;
        r->refs[slot].n = out->n;
        r->refs[slot].value = out->i;
        r->refs[slot].is_str = out->is_str;
        r->refs[slot].is_int = out->is_int;
    }
}

static void parse_answer(const unsigned char *data, size_t size, struct answer *a) {
    memset(a, 0, sizeof *a);
    struct reader *r = calloc(1, sizeof *r);
    if (!r || size == 0 || (data[0] & 0x7f) != '{') {
        free(r);
        return;
    }
    r->p = data + 1;
    r->end = data + size;
    if (data[0] & 0x80)
        r->nrefs = 1; /* the dict itself */
    struct value key, value;
    int end = 0;
    while (!r->failed) {
        read_value(r, &key, 1, &end);
        if (end || r->failed)
            break;
        read_value(r, &value, 1, NULL);
        if (r->failed)
            break;
        a->entries++;
        if (key.is_str && key.n == 4 && memcmp(key.s, "kind", 4) == 0 && value.is_str && value.n < sizeof a->kind) {
            memcpy(a->kind, value.s, value.n);
            a->kind[value.n] = 0;
        } else if (key.is_str && key.n == 4 && memcmp(key.s, "code", 4) == 0 && value.is_int) {
            a->code = value.i;
            a->has_code = 1;
        }
    }
    a->ok = end && !r->failed && r->p == r->end; /* marshal.loads of the frame would have given this dict */
    free(r);
}

/* -- the server's answers, and our signals -- */

/* Exactly n bytes (0 at the peer's end first); descriptors that come along are closed. */
static int receive(unsigned char *into, size_t n) {
    size_t got = 0;
    while (got < n) {
        char control[CMSG_SPACE(sizeof(int) * 16)];
        struct iovec iov = {into + got, n - got};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = sizeof control};
        ssize_t r = recvmsg(server, &msg, MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR)
            continue;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); r >= 0 && c; c = CMSG_NXTHDR(&msg, c))
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
                for (int *fd = (int *)CMSG_DATA(c); (unsigned char *)(fd + 1) <= (unsigned char *)c + c->cmsg_len; fd++)
                    close(*fd);
        if (r <= 0)
            return 0;
        got += (size_t)r;
    }
    return 1;
}

static void forward(int signum) {
    int saved = errno;
    if (signum != SIGWINCH && !forwarded)
        forwarded = signum;
    signal_frame.data[signal_byte] = (unsigned char)signum;
    ssize_t sent = send(server, signal_frame.data, signal_frame.size, MSG_NOSIGNAL);
    (void)sent;
    errno = saved;
}

int main(int argc, char **argv) {
    given = argv;
    static const char *const thin[] = {"exec", "run", "map", "batch", "shell"};
    int is_thin = 0;
    for (size_t i = 0; argc > 1 && i < sizeof thin / sizeof thin[0]; i++)
        is_thin |= strcmp(argv[1], thin[i]) == 0;
    const char *mode = getenv("QUINEBOX_SERVE");
    if (!is_thin || (mode && strcmp(mode, "auto") != 0 && strcmp(mode, "manual") != 0) || getenv("QUINEBOX_HANDED"))
        python(NULL);
    struct stat info;
    for (int fd = 0; fd <= 2; fd++) /* closed stdio gets /dev/null before any socket can become fd 0-2 */
        if (fstat(fd, &info) < 0 && open("/dev/null", O_RDWR) < 0)
            python(NULL);

    /* The state dir as state.py's state_root finds it; anything it would make or refuse is the Python client's. */
    char root[4096], run[4096 + 8];
    const char *override = getenv("QUINEBOX_STATE_DIR"), *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    if (override && *override) {
        if (override[0] != '/' || snprintf(root, sizeof root, "%s", override) >= (int)sizeof root)
            python(NULL);
    } else if (xdg && xdg[0] == '/') {
        if (snprintf(root, sizeof root, "%s/quinebox", xdg) >= (int)sizeof root)
            python(NULL);
    } else if (home && home[0] == '/') {
        if (snprintf(root, sizeof root, "%s/.local/state/quinebox", home) >= (int)sizeof root)
            python(NULL);
    } else {
        python(NULL);
    }
    uid_t me = geteuid();
    snprintf(run, sizeof run, "%s/run", root);
    if (stat(root, &info) < 0 || !S_ISDIR(info.st_mode) || info.st_uid != me || (info.st_mode & 022))
        python(NULL);
    if (lstat(run, &info) < 0 || !S_ISDIR(info.st_mode) || info.st_uid != me || (info.st_mode & 022))
        python(NULL);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (snprintf(address.sun_path, sizeof address.sun_path, "%s/%s", run, SERVE_SOCKET) >= (int)sizeof address.sun_path)
        python(NULL);

    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd))
        python(NULL);
    mode_t umask_now = umask(022);
    umask(umask_now);
    struct buffer frame = {0};
    if (!run_frame(&frame, argv + 1, cwd, umask_now) || !make_signal_frame(&signal_frame))
        python(NULL);

    server = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (server < 0 || connect(server, (struct sockaddr *)&address, sizeof address) < 0)
        python(NULL);
    struct ucred peer;
    socklen_t len = sizeof peer;
    if (getsockopt(server, SOL_SOCKET, SO_PEERCRED, &peer, &len) < 0)
        python(NULL);
    if (peer.uid != me) { /* another user's process answers there: it got no byte; the Python client says so */
        char foreign[32];
        snprintf(foreign, sizeof foreign, "foreign:%u", (unsigned)peer.uid);
        close(server);
        python(foreign);
    }

    int fds[4] = {0, 1, 2, -1}, nfds = 3;
    int tty = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC); /* where questions for a person go (audit/prompt.py) */
    if (tty >= 0)
        fds[nfds++] = tty;
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec iov = {frame.data, frame.size};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control, .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    ssize_t sent;
    do
        sent = sendmsg(server, &msg, MSG_NOSIGNAL);
    while (sent < 0 && errno == EINTR);
    if (sent < 0)
        python(NULL); /* it got nothing of the command: the Python client tries again */
    for (size_t off = (size_t)sent; off < frame.size;) {
        ssize_t more = send(server, frame.data + off, frame.size - off, MSG_NOSIGNAL);
        if (more < 0 && errno == EINTR)
            continue;
        if (more <= 0)
            break; /* the worker is gone: said below, as the Python client says it */
        off += (size_t)more;
    }
    if (tty >= 0)
        close(tty);
    free(frame.data);

    struct sigaction action = {.sa_handler = forward, .sa_flags = SA_RESTART};
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < NFORWARDED; i++)
        sigaddset(&action.sa_mask, FORWARDED[i]); /* one frame at a time on the socket */
    struct sigaction before[NFORWARDED];
    for (size_t i = 0; i < NFORWARDED; i++)
        sigaction(FORWARDED[i], &action, &before[i]);

    for (;;) {
        unsigned char header[4];
        struct answer a = {0};
        unsigned char *body = NULL;
        if (receive(header, 4)) {
            uint32_t size = (uint32_t)header[0] << 24 | (uint32_t)header[1] << 16 | (uint32_t)header[2] << 8 | header[3];
            if (size > 0 && size <= MAX_FRAME && (body = malloc(size)) && receive(body, size))
                parse_answer(body, size, &a);
            else
                size = 0;
            free(body);
            if (size == 0)
                goto gone;
        } else {
            goto gone;
        }
        if (!a.ok || a.entries == 0)
            goto gone; /* none of ours, or an empty dict: client.py reads either as {}, the worker's end */
        if (strcmp(a.kind, "exit") == 0)
            _exit(a.has_code ? (int)(a.code & 0xff) : EXIT_QUINEBOX);
        if (strcmp(a.kind, "stale") == 0 || strcmp(a.kind, "confined") == 0) {
            for (size_t i = 0; i < NFORWARDED; i++)
                sigaction(FORWARDED[i], &before[i], NULL);
            close(server);
            python(a.kind);
        }
        continue;
    gone:
        if (forwarded) /* it died of the signal we passed on, before the command could catch it: as a cold run would */
            _exit(128 + forwarded);
        dprintf(2, "quinebox: the command server's worker for this command is gone (`quinebox serve status`); run again\n");
        _exit(EXIT_QUINEBOX);
    }
}

/* A connection storm in C (bench/scale.py --storm): N AMQP connections opened at once, at a client cost so small
 * that the broker, not the client, sets the pace.
 *
 *   storm --port P --connections N [--host 127.0.0.1] [--timeout T] [--reconnect-for S]
 *
 * Every socket's connect is issued at once, none waiting for another's admission (between every CONNECT_BATCH
 * connects, what is ready is served: as many clients on as many machines would each speak as soon as connected);
 * each sends the protocol header (no SASL layer: a haqueue broker lets such clients in as anonymous) and an open
 * frame, and is admitted once the broker's open arrives; a close frame, a socket closed by the broker or T seconds without an answer is a refusal.
 * Admitted connections stay open and answer nothing: the broker's idle timeout is longer than a run.
 * Prints one JSON line once every connection has its outcome: {"connections", "admitted", "refused", "failed",
 * "first_s", "median_s", "last_s"}, times from the first connect to each admission.
 *
 * --reconnect-for S: then, for up to S seconds, a connection the broker drops (a failover) is opened again, 50 ms
 * after the drop and then every 50 ms until admitted; prints a second JSON line: {"dropped", "reconnected",
 * "first_drop", "last_admitted"} (CLOCK_MONOTONIC seconds, the clock of Python's time.monotonic) once each dropped
 * connection is back (or S passed).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { OPEN = 0x10, CLOSE = 0x18, BUF = 4096, RETRY_MS = 50, CONNECT_BATCH = 64 };
enum state { IDLE, CONNECTING, WAITING, ADMITTED, REFUSED };

/* "AMQP" 0 1 0 0, then an open frame: size 21, doff 2, type 0, channel 0; open(container-id "storm") */
static const unsigned char OPENING[] = {'A', 'M', 'Q', 'P', 0, 1, 0, 0,
                                        0, 0, 0, 21, 2, 0, 0, 0,
                                        0x00, 0x53, 0x10, 0xc0, 0x08, 0x01, 0xa1, 0x05, 's', 't', 'o', 'r', 'm'};

struct conn {
    int fd;
    enum state state;
    double started, admitted, retry_at;
    size_t have;  /* bytes of in[] not yet parsed */
    size_t header_left;  /* the broker's protocol header still to skip */
    unsigned char in[BUF];
};

static struct sockaddr_in peer;
static int ep;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void start(struct conn *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (c->fd < 0) { perror("socket"); exit(1); }
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->state = CONNECTING;
    c->started = now();
    c->have = 0;
    c->header_left = 8;
    if (connect(c->fd, (struct sockaddr *)&peer, sizeof peer) < 0 && errno != EINPROGRESS) {
        c->state = REFUSED;
        close(c->fd);
        c->fd = -1;
        return;
    }
    struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
}

static void drop(struct conn *c) {
    if (c->fd >= 0) close(c->fd);  /* close removes it from the epoll set */
    c->fd = -1;
    c->state = REFUSED;
}

/* The frames read so far: the first open admits, a close refuses (or, once admitted, drops). */
static void parse(struct conn *c) {
    size_t at = 0;
    if (c->header_left) {
        size_t n = c->have < c->header_left ? c->have : c->header_left;
        c->header_left -= n;
        at = n;
    }
    while (c->have - at >= 11) {
        unsigned char *f = c->in + at;
        size_t size = (size_t)f[0] << 24 | f[1] << 16 | f[2] << 8 | f[3];
        size_t body = f[4] * 4;
        if (size > BUF || body + 3 > size) { drop(c); return; }  /* not what a broker's open or close looks like */
        if (c->have - at < size) break;
        if (size > 8 && f[body] == 0x00 && f[body + 1] == 0x53) {
            if (f[body + 2] == OPEN && c->state == WAITING) {
                c->state = ADMITTED;
                c->admitted = now();
            } else if (f[body + 2] == CLOSE) {
                drop(c);
                return;
            }
        }
        at += size;
    }
    memmove(c->in, c->in + at, c->have - at);
    c->have -= at;
}

static void serve(struct conn *c, unsigned events) {
    if (c->state == CONNECTING && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err || send(c->fd, OPENING, sizeof OPENING, MSG_NOSIGNAL) != (ssize_t)sizeof OPENING) { drop(c); return; }
        c->state = WAITING;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        ssize_t n = recv(c->fd, c->in + c->have, BUF - c->have, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN)) { drop(c); return; }
        if (n > 0) {
            c->have += n;
            parse(c);
        }
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *host = "127.0.0.1";
    int port = 0, n = 0;
    double timeout = 60, reconnect_for = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--host")) host = argv[i + 1];
        else if (!strcmp(argv[i], "--port")) port = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--connections")) n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--timeout")) timeout = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--reconnect-for")) reconnect_for = atof(argv[i + 1]);
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    if (!port || n <= 0) { fprintf(stderr, "usage: storm --port P --connections N [--timeout T] [--reconnect-for S]\n"); return 2; }
    struct rlimit rl;  /* a descriptor per connection */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) { rl.rlim_cur = rl.rlim_max; setrlimit(RLIMIT_NOFILE, &rl); }
    peer.sin_family = AF_INET;
    peer.sin_port = htons(port);
    inet_pton(AF_INET, host, &peer.sin_addr);
    ep = epoll_create1(0);
    struct conn *conns = calloc(n, sizeof *conns);
    struct epoll_event events[256];
    double t0 = now();
    for (int i = 0; i < n; i++) {
        start(&conns[i]);
        if (i % CONNECT_BATCH == CONNECT_BATCH - 1) {
            int k = epoll_wait(ep, events, 256, 0);
            for (int j = 0; j < k; j++) serve(events[j].data.ptr, events[j].events);
        }
    }
    int pending = n;
    while (pending > 0 && now() - t0 < timeout) {
        int k = epoll_wait(ep, events, 256, 100);
        for (int i = 0; i < k; i++) serve(events[i].data.ptr, events[i].events);
        pending = 0;
        for (int i = 0; i < n; i++) pending += conns[i].state == CONNECTING || conns[i].state == WAITING;
    }
    double *times = malloc(n * sizeof *times);
    int admitted = 0, refused = 0;
    for (int i = 0; i < n; i++) {
        if (conns[i].state == ADMITTED) times[admitted++] = conns[i].admitted - t0;
        else if (conns[i].state == REFUSED) refused++;
    }
    qsort(times, admitted, sizeof *times, cmp);
    printf("{\"connections\": %d, \"admitted\": %d, \"refused\": %d, \"failed\": %d, \"first_s\": %.4f, "
           "\"median_s\": %.4f, \"last_s\": %.4f}\n", n, admitted, refused, n - admitted - refused,
           admitted ? times[0] : -1.0, admitted ? times[admitted / 2] : -1.0, admitted ? times[admitted - 1] : -1.0);
    fflush(stdout);
    if (reconnect_for <= 0) return 0;
    /* Every connection admitted so far is watched; one dropped comes back, RETRY_MS apart, until admitted. */
    int *watched = calloc(n, sizeof *watched);
    for (int i = 0; i < n; i++) watched[i] = conns[i].state == ADMITTED;
    int dropped = 0, back = 0;
    double first_drop = 0, last_admitted = 0, end = now() + reconnect_for;
    while (now() < end && (dropped == 0 || back < dropped)) {
        int k = epoll_wait(ep, events, 256, 10);
        for (int i = 0; i < k; i++) serve(events[i].data.ptr, events[i].events);
        double t = now();
        dropped = back = 0;
        for (int i = 0; i < n; i++) {
            struct conn *c = &conns[i];
            if (!watched[i]) continue;
            if (watched[i] == 1 && c->state != ADMITTED) {  /* dropped: back in RETRY_MS */
                watched[i] = 2;
                if (first_drop == 0) first_drop = t;
                c->retry_at = t + RETRY_MS / 1000.0;
            }
            if (watched[i] == 2) {
                dropped++;
                if (c->state == REFUSED && t >= c->retry_at) {
                    start(c);
                    c->retry_at = t + RETRY_MS / 1000.0;
                } else if ((c->state == CONNECTING || c->state == WAITING) && t - c->started > 5) {
                    drop(c);  /* a try a dead primary's address holds: give up on it, try again */
                } else if (c->state == ADMITTED) {
                    back++;
                    if (c->admitted > last_admitted) last_admitted = c->admitted;
                }
            }
        }
    }
    printf("{\"dropped\": %d, \"reconnected\": %d, \"first_drop\": %.4f, \"last_admitted\": %.4f}\n", dropped, back,
           first_drop, last_admitted);
    return 0;
}

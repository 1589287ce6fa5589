/* The system calls a broker cannot avoid for a lone message, with nothing else: the floor under
 * "broker CPU per message at 1,000 msg/s" on this machine (bench/floor.py runs it; design/performance.md).
 *
 * One binary, four roles, over loopback TCP as the broker's clients and peers are. Every record is
 * BODY bytes (a message, or a dequeue marked 'D'); an acknowledgement is REPLY bytes.
 *   relay PORT BACKUPS     the broker: accepts a producer, a consumer and BACKUPS backups (each says
 *                          which it is in its first byte). Per message it wakes in epoll_wait for the
 *                          producer's record, sends it to each backup and to the consumer; once every
 *                          backup has acknowledged it, sends the producer its settlement; it wakes again
 *                          for the consumer's accept and sends each backup a dequeue. With no backups:
 *                          two wake-ups, two recvs and two sends per message, what a single broker does.
 *   backup PORT            acknowledges every message record (not the dequeues)
 *   producer PORT RATE N   sends N records at RATE msg/s, reads the settlements
 *   consumer PORT N        reads N records, answers each with an accept
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { BODY = 100, REPLY = 16, MAX_BACKUPS = 8 };

static void die(const char *what) { perror(what); exit(1); }

static void send_all(int fd, const char *buf, size_t n)
{
    if (send(fd, buf, n, 0) != (ssize_t)n) die("send");
}

static void read_exactly(int fd, char *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r <= 0) die("recv");
        got += (size_t)r;
    }
}

static int connect_as(int port, char role)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    send_all(fd, &role, 1);
    return fd;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Whole records arrive from the peer at fd into buf (size held at *have); returns how many are whole. */
static int take(int fd, char *buf, size_t *have, size_t record)
{
    ssize_t r = recv(fd, buf + *have, 65536 - *have, 0);
    if (r <= 0) return -1;
    *have += (size_t)r;
    return (int)(*have / record);
}

static void consume(char *buf, size_t *have, size_t bytes)
{
    memmove(buf, buf + bytes, *have - bytes);
    *have -= bytes;
}

static int relay(int port, int backups)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 16) < 0) die("listen");
    printf("ready\n");
    fflush(stdout);
    int producer = -1, consumer = -1, backup[MAX_BACKUPS], nb = 0;
    while (producer < 0 || consumer < 0 || nb < backups) {
        int fd = accept(lfd, NULL, NULL);
        char role;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        read_exactly(fd, &role, 1);
        if (role == 'P') producer = fd;
        else if (role == 'C') consumer = fd;
        else if (nb < MAX_BACKUPS) backup[nb++] = fd;
    }
    int ep = epoll_create1(0), fds[2 + MAX_BACKUPS] = {producer, consumer};
    memcpy(fds + 2, backup, sizeof(int) * nb);
    for (int i = 0; i < 2 + nb; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
    }
    static char in[2 + MAX_BACKUPS][65536];
    size_t have[2 + MAX_BACKUPS] = {0};
    long received = 0, settled = 0, acked[MAX_BACKUPS] = {0};
    char reply[REPLY] = {0}, dequeue[BODY] = {'D'};
    for (;;) {
        struct epoll_event ready[2 + MAX_BACKUPS];
        int n = epoll_wait(ep, ready, 2 + nb, -1);
        for (int e = 0; e < n; e++) {
            int i = (int)ready[e].data.u32;
            int whole = take(fds[i], in[i], &have[i], i == 0 ? BODY : REPLY);
            if (whole < 0) return 0; /* a client is done */
            for (int m = 0; m < whole; m++) {
                if (i == 0) { /* a message: to the backups and the consumer */
                    for (int b = 0; b < nb; b++) send_all(backup[b], in[0] + m * BODY, BODY);
                    send_all(consumer, in[0] + m * BODY, BODY);
                    received++;
                } else if (i == 1) { /* the consumer's accept: a dequeue to each backup */
                    for (int b = 0; b < nb; b++) send_all(backup[b], dequeue, BODY);
                } else {
                    acked[i - 2]++;
                }
            }
            consume(in[i], &have[i], (size_t)whole * (i == 0 ? BODY : REPLY));
        }
        long confirmed = received; /* settle what every backup has acknowledged */
        for (int b = 0; b < nb; b++) confirmed = acked[b] < confirmed ? acked[b] : confirmed;
        for (; settled < confirmed; settled++) send_all(producer, reply, REPLY);
    }
}

static int backup(int port)
{
    int fd = connect_as(port, 'B');
    char record[BODY], reply[REPLY] = {0};
    for (;;) {
        for (size_t got = 0; got < BODY;) {
            ssize_t r = recv(fd, record + got, BODY - got, 0);
            if (r <= 0) return 0; /* the relay is done */
            got += (size_t)r;
        }
        if (record[0] != 'D') send_all(fd, reply, REPLY);
    }
}

static int producer(int port, double rate, long n)
{
    int fd = connect_as(port, 'P');
    char body[BODY] = {'M'}, reply[REPLY];
    double start = now();
    for (long i = 0; i < n; i++) {
        double wait = start + i / rate - now();
        if (wait > 0) {
            struct timespec t = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - (time_t)wait) * 1e9)};
            nanosleep(&t, NULL);
        }
        send_all(fd, body, BODY);
        read_exactly(fd, reply, REPLY);
    }
    return 0;
}

static int consumer(int port, long n)
{
    int fd = connect_as(port, 'C');
    char body[BODY], reply[REPLY] = {0};
    for (long i = 0; i < n; i++) {
        read_exactly(fd, body, BODY);
        send_all(fd, reply, REPLY);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "relay")) return relay(atoi(argv[2]), atoi(argv[3]));
    if (argc >= 3 && !strcmp(argv[1], "backup")) return backup(atoi(argv[2]));
    if (argc >= 5 && !strcmp(argv[1], "producer")) return producer(atoi(argv[2]), atof(argv[3]), atol(argv[4]));
    if (argc >= 4 && !strcmp(argv[1], "consumer")) return consumer(atoi(argv[2]), atol(argv[3]));
    fprintf(stderr, "usage: relay PORT BACKUPS | backup PORT | producer PORT RATE N | consumer PORT N\n");
    return 2;
}

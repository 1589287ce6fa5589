/* The system calls a broker cannot avoid for a lone message, with nothing else: the floor under
 * "broker CPU per message at 1,000 msg/s" on this machine (bench/floor.py runs it; design/performance.md).
 *
 * One binary, three roles, over loopback TCP as the broker's clients are:
 *   relay PORT                 accepts a producer then a consumer; per message it wakes in epoll_wait,
 *                              reads the producer's 100 bytes, sends them to the consumer and a 16-byte
 *                              settlement to the producer, then wakes again for the consumer's 16-byte
 *                              accept: the broker's two wake-ups, two recvs and two sends per message
 *   producer PORT RATE N       sends N 100-byte messages at RATE msg/s, reads the settlements
 *   consumer PORT N            reads N messages, answers each with an accept
 */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { BODY = 100, REPLY = 16 };

static void die(const char *what) { perror(what); exit(1); }

static int connect_to(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void read_exactly(int fd, char *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = recv(fd, buf + got, n - got, 0);
        if (r <= 0) die("recv");
        got += (size_t)r;
    }
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int relay(int port)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 4) < 0) die("listen");
    printf("ready\n");
    fflush(stdout);
    int producer = accept(lfd, NULL, NULL), consumer = accept(lfd, NULL, NULL);
    setsockopt(producer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(consumer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = producer};
    epoll_ctl(ep, EPOLL_CTL_ADD, producer, &ev);
    ev.data.fd = consumer;
    epoll_ctl(ep, EPOLL_CTL_ADD, consumer, &ev);
    char buf[65536], reply[REPLY] = {0};
    for (;;) {
        struct epoll_event ready[2];
        int n = epoll_wait(ep, ready, 2, -1);
        for (int i = 0; i < n; i++) {
            ssize_t r = recv(ready[i].data.fd, buf, sizeof buf, 0);
            if (r <= 0) return 0; /* a client is done */
            if (ready[i].data.fd == producer) {
                for (ssize_t m = 0; m < r / BODY; m++) {
                    if (send(consumer, buf + m * BODY, BODY, 0) != BODY) die("send");
                    if (send(producer, reply, REPLY, 0) != REPLY) die("send");
                }
            }
        }
    }
}

static int producer(int port, double rate, long n)
{
    int fd = connect_to(port);
    char body[BODY] = {0}, reply[REPLY];
    double start = now();
    for (long i = 0; i < n; i++) {
        double due = start + i / rate, wait = due - now();
        if (wait > 0) {
            struct timespec t = {.tv_sec = (time_t)wait, .tv_nsec = (long)((wait - (time_t)wait) * 1e9)};
            nanosleep(&t, NULL);
        }
        if (send(fd, body, BODY, 0) != BODY) die("send");
        read_exactly(fd, reply, REPLY);
    }
    return 0;
}

static int consumer(int port, long n)
{
    int fd = connect_to(port);
    char body[BODY], reply[REPLY] = {0};
    for (long i = 0; i < n; i++) {
        read_exactly(fd, body, BODY);
        if (send(fd, reply, REPLY, 0) != REPLY) die("send");
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "relay")) return relay(atoi(argv[2]));
    if (argc >= 5 && !strcmp(argv[1], "producer")) return producer(atoi(argv[2]), atof(argv[3]), atol(argv[4]));
    if (argc >= 4 && !strcmp(argv[1], "consumer")) return consumer(atoi(argv[2]), atol(argv[3]));
    fprintf(stderr, "usage: relay PORT | producer PORT RATE N | consumer PORT N\n");
    return 2;
}

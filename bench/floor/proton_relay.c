/* The floor with proton's engine on it: what a lone message costs a broker written in C on the same engine
 * haqueue drives (libqpid-proton-core), with nothing of haqueue's own: no queue, no store, no Python. Set
 * between relay.c (the system calls alone) and haqueue, it says how much of haqueue's CPU per message at
 * 1,000 msg/s is proton's encoding, decoding and bookkeeping, and how much is haqueue's (design/performance.md).
 *
 *   proton_relay PORT     serves AMQP 1.0 on 127.0.0.1:PORT (no SASL layer, as the C clients speak without a
 *                         username) and prints "ready". A message received on any link is accepted and settled
 *                         at once, then sent on a link consuming from the same address if one has credit, else
 *                         held in memory (FIFO) until one has; a consumer's outcome settles the delivery. Nothing
 *                         is redelivered: what a consumer takes is gone.
 *
 * The pass is haqueue's (engine.py): wait for the ready sockets, read each into its transport, walk the collector,
 * write every transport with output. One address's messages and links are kept in a short table (bench loads use
 * one or a few addresses).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/event.h>
#include <proton/link.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <proton/transport.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

enum { MAX_FDS = 1024, MAX_ADDRESSES = 64, CREDIT = 1000 };

typedef struct message { struct message *next; size_t size; char data[]; } message;

typedef struct {
    char name[256];
    message *head, *tail;    /* held: no consumer had credit */
    pn_link_t *consumers[8];
    int n_consumers;
} address;

static pn_transport_t *transports[MAX_FDS];
static address addresses[MAX_ADDRESSES];
static int n_addresses;
static unsigned long tags;

static void die(const char *what) { perror(what); exit(1); }

static address *find(const char *name)
{
    if (!name)
        name = "";
    for (int i = 0; i < n_addresses; i++)
        if (strcmp(addresses[i].name, name) == 0)
            return &addresses[i];
    if (n_addresses == MAX_ADDRESSES) {
        fprintf(stderr, "proton_relay: more than %d addresses\n", MAX_ADDRESSES);
        exit(1);
    }
    address *a = &addresses[n_addresses++];
    snprintf(a->name, sizeof a->name, "%s", name);
    return a;
}

static void send_one(pn_link_t *link, const message *m)
{
    unsigned long tag = ++tags;
    pn_delivery(link, pn_dtag((const char *)&tag, sizeof tag));
    pn_link_send(link, m->data, m->size);
    pn_link_advance(link);
}

/* Hand held messages to the address's consumers with credit, round robin. */
static void dispatch(address *a)
{
    int i = 0, idle = 0;
    while (a->head && a->n_consumers && idle < a->n_consumers) {
        pn_link_t *link = a->consumers[i];
        i = (i + 1) % a->n_consumers;
        if (pn_link_credit(link) <= 0) {
            idle++;
            continue;
        }
        idle = 0;
        message *m = a->head;
        a->head = m->next;
        if (!a->head)
            a->tail = NULL;
        send_one(link, m);
        free(m);
    }
}

static void received(pn_delivery_t *d)
{
    pn_link_t *link = pn_delivery_link(d);
    size_t size = pn_delivery_pending(d);
    message *m = malloc(sizeof *m + size);
    if (!m)
        die("malloc");
    m->next = NULL;
    m->size = (size_t)pn_link_recv(link, m->data, size);
    pn_link_advance(link);
    pn_delivery_update(d, PN_ACCEPTED);
    pn_delivery_settle(d);
    if (pn_link_credit(link) < CREDIT / 2)
        pn_link_flow(link, CREDIT - pn_link_credit(link));
    address *a = find(pn_terminus_get_address(pn_link_target(link)));
    if (a->tail)
        a->tail->next = m;
    else
        a->head = m;
    a->tail = m;
    dispatch(a);
}

static void forget_consumer(pn_link_t *link)
{
    address *a = find(pn_terminus_get_address(pn_link_source(link)));
    for (int i = 0; i < a->n_consumers; i++)
        if (a->consumers[i] == link) {
            a->consumers[i] = a->consumers[--a->n_consumers];
            return;
        }
}

static void handle(pn_event_t *e)
{
    switch (pn_event_type(e)) {
    case PN_CONNECTION_REMOTE_OPEN:
        pn_connection_open(pn_event_connection(e));
        break;
    case PN_CONNECTION_REMOTE_CLOSE:
        pn_connection_close(pn_event_connection(e));
        break;
    case PN_SESSION_REMOTE_OPEN:
        pn_session_open(pn_event_session(e));
        break;
    case PN_SESSION_REMOTE_CLOSE:
        pn_session_close(pn_event_session(e));
        break;
    case PN_LINK_REMOTE_OPEN: {
        pn_link_t *link = pn_event_link(e);
        pn_terminus_copy(pn_link_source(link), pn_link_remote_source(link));
        pn_terminus_copy(pn_link_target(link), pn_link_remote_target(link));
        pn_link_open(link);
        if (pn_link_is_receiver(link)) {
            pn_link_flow(link, CREDIT);
        } else {
            address *a = find(pn_terminus_get_address(pn_link_source(link)));
            if (a->n_consumers < 8)
                a->consumers[a->n_consumers++] = link;
        }
        break;
    }
    case PN_LINK_REMOTE_CLOSE:
    case PN_LINK_REMOTE_DETACH: {
        pn_link_t *link = pn_event_link(e);
        if (pn_link_is_sender(link))
            forget_consumer(link);
        pn_link_close(link);
        break;
    }
    case PN_LINK_FLOW: {
        pn_link_t *link = pn_event_link(e);
        if (pn_link_is_sender(link))
            dispatch(find(pn_terminus_get_address(pn_link_source(link))));
        break;
    }
    case PN_DELIVERY: {
        pn_delivery_t *d = pn_event_delivery(e);
        if (pn_link_is_receiver(pn_delivery_link(d))) {
            if (pn_delivery_readable(d) && !pn_delivery_partial(d))
                received(d);
        } else if (pn_delivery_updated(d) && (pn_delivery_remote_state(d) || pn_delivery_settled(d))) {
            pn_delivery_settle(d);
        }
        break;
    }
    default:
        break;
    }
}

static void drop(int epfd, int fd)
{
    pn_transport_t *t = transports[fd];
    pn_connection_t *c = pn_transport_connection(t);
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
    close(fd);
    for (pn_link_t *l = pn_link_head(c, 0); l; l = pn_link_next(l, 0))
        if (pn_link_is_sender(l))
            forget_consumer(l);
    pn_transport_unbind(t);
    pn_transport_free(t);
    pn_connection_free(c);
    transports[fd] = NULL;
}

static void accept_all(int epfd, int listener, pn_collector_t *collector)
{
    for (;;) {
        int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK);
        if (fd < 0)
            return;
        if (fd >= MAX_FDS)
            die("too many connections");
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        pn_transport_t *t = pn_transport();
        pn_transport_set_server(t);
        pn_connection_t *c = pn_connection();
        pn_connection_collect(c, collector);
        pn_connection_set_container(c, "proton-relay");
        pn_transport_bind(t, c);
        transports[fd] = t;
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
            die("epoll_ctl");
    }
}

static void read_into(int fd)
{
    pn_transport_t *t = transports[fd];
    ssize_t room = pn_transport_capacity(t);
    if (room <= 0)
        return;
    ssize_t n = recv(fd, pn_transport_tail(t), (size_t)room, 0);
    if (n > 0)
        pn_transport_process(t, (size_t)n);
    else if (n == 0 || (errno != EAGAIN && errno != EINTR))
        pn_transport_close_tail(t); /* the peer gone: dropped once the transport's output is done too */
}

/* Every transport's output, written out; those closed both ways are dropped. */
static void write_all(int epfd, int top)
{
    for (int fd = 0; fd <= top; fd++) {
        pn_transport_t *t = transports[fd];
        if (!t)
            continue;
        ssize_t pending;
        while ((pending = pn_transport_pending(t)) > 0) {
            ssize_t n = send(fd, pn_transport_head(t), (size_t)pending, MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN && errno != EINTR) {
                pn_transport_close_head(t); /* the peer gone: its output goes nowhere */
                continue;
            }
            if (n <= 0)
                break; /* a full socket: a bench's clients read what they are sent */
            pn_transport_pop(t, (size_t)n);
        }
        if (pending < 0 && pn_transport_closed(t))
            drop(epfd, fd);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: proton_relay PORT\n");
        return 2;
    }
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(listener, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(listener, 128) < 0)
        die("listen");
    int epfd = epoll_create1(0);
    struct epoll_event lev = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(epfd, EPOLL_CTL_ADD, listener, &lev);
    pn_collector_t *collector = pn_collector();
    printf("ready\n");
    fflush(stdout);
    int top = listener;
    for (;;) {
        struct epoll_event ready[32];
        int n = epoll_wait(epfd, ready, 32, -1);
        for (int i = 0; i < n; i++) {
            int fd = ready[i].data.fd;
            if (fd == listener) {
                accept_all(epfd, listener, collector);
                for (int f = top; f < MAX_FDS; f++)
                    if (transports[f])
                        top = f;
            } else if (transports[fd]) {
                read_into(fd);
            }
        }
        do { /* writing raises events too (a flow reported, a close): until none is left */
            pn_event_t *e;
            while ((e = pn_collector_peek(collector))) {
                handle(e);
                pn_collector_pop(collector);
            }
            write_all(epfd, top);
        } while (pn_collector_peek(collector));
    }
}

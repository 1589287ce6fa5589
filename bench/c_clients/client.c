/* Benchmark producer and consumer in C: the rhea clients' (bench/js) arguments, body layout and JSON
 * result, at a small fraction of their CPU per message, so that on this 2-core machine the brokers get
 * the cores (bench/run.py --clients c; design/sharding.md, "What one machine shows").
 *
 *   client producer --port P --address A --messages N [--size S] [--inflight W] [--seq-base B] [--durable]
 *                   [--priorities K] [--rate R --duration D]
 *   client consumer --port P --address A --messages N [--credit C] [--seq-base B] [--subscription NAME]
 *                   [--warmup M]
 *   (both: --host 127.0.0.1 --username U --password X --timeout T --container-id ID; --stall is accepted
 *    and ignored)
 *
 * At-least-once like the rhea clients: the producer sends unsettled transfers, at most W unsettled, within
 * the link's credit and the session's window, and counts the broker's settlements; the consumer grants C
 * credit, accepts and settles what each read brought in one disposition, and grants again. The body
 * is a data section whose bytes 0-7 hold the send time (µs, CLOCK_MONOTONIC, a little-endian double) and
 * 8-11 the sequence number (little-endian), as bench/js/common.js lays them out. SASL PLAIN when a username
 * is given, no SASL layer otherwise. --rate R paces the producer at R msg/s (message i is not sent before
 * i / R s after the first; R × D messages with --duration D), as bench/js/producer.js does for the fixed-rate
 * latency run; the consumer's `latency` then leaves out the first M messages by sequence (--warmup M), its
 * `latency_all` keeps them. --priorities K: the header's priority
 * of the i-th message sent is i % K (a priority queue's load; the consumer counts the reordering in
 * out_of_order, which is no failure). --subscription NAME: the consumer's link is named NAME and its source is
 * durable (unsettled-state) with expiry-policy never, a durable subscription when A is an exchange: with the same
 * --container-id it resumes one (the connection's close ends the link without closing it, so it stays). The
 * consumer's result gives the time its attach was sent (attach_us, the same clock as first_recv_us).
 *
 * Only what these two links need of AMQP 1.0 is here: the performatives are written with fixed-width
 * encodings, and read with a decoder of the primitive types that skips what it does not need.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { OPEN = 0x10, BEGIN = 0x11, ATTACH = 0x12, FLOW = 0x13, TRANSFER = 0x14, DISPOSITION = 0x15,
       DETACH = 0x16, END = 0x17, CLOSE = 0x18, SASL_INIT = 0x41, SASL_OUTCOME = 0x44 };
enum { ACCEPTED = 0x24, REJECTED = 0x25, RELEASED = 0x26, MODIFIED = 0x27 };
enum { BODY_TS = 0, BODY_SEQ = 8, BODY_MIN = 12, WINDOW = 0x7fffffff };
enum { IN_SIZE = 1 << 20, MAX_FRAME = 65536 }; /* our max-frame-size: the broker splits larger messages */

/* ------------------------------------------------------------------ options, clock, result */

static struct {
    const char *role, *host, *address, *username, *password, *container_id, *subscription;
    int port, size, inflight, credit, timeout, priorities;
    long messages, seq_base, warmup;
    double rate, duration;
    bool durable;
} opt = {.host = "127.0.0.1", .address = "bench", .username = "", .password = "", .port = 5672, .size = 100,
         .inflight = 1000, .credit = 1000, .timeout = 120, .messages = 100000};

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static double cpu_us(void)
{
    struct rusage r;
    getrusage(RUSAGE_SELF, &r);
    return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e6 + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
}

static char error_text[512];
static double cpu0;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ------------------------------------------------------------------ writing frames */

static uint8_t *out;
static size_t out_len, out_cap;

static void put(const void *p, size_t n)
{
    if (out_len + n > out_cap) fail("output buffer full");
    memcpy(out + out_len, p, n);
    out_len += n;
}
static void u8(uint8_t v) { put(&v, 1); }
static void u32(uint32_t v) { uint8_t b[4] = {v >> 24, v >> 16, v >> 8, v}; put(b, 4); }
static void patch32(size_t at, uint32_t v) { uint8_t b[4] = {v >> 24, v >> 16, v >> 8, v}; memcpy(out + at, b, 4); }

static void put_null(void) { u8(0x40); }
static void put_bool(bool v) { u8(v ? 0x41 : 0x42); }
static void put_uint(uint32_t v) { u8(0x70); u32(v); }
static void text(uint8_t code8, const char *s, size_t n) /* str8, sym8 or vbin8 (n < 256) */
{
    u8(code8);
    u8((uint8_t)n);
    put(s, n);
}
static void put_str(const char *s) { text(0xA1, s, strlen(s)); }

/* A described list: the descriptor, list32, and its size and count patched by end_list. */
static size_t begin_list(uint8_t descriptor)
{
    uint8_t head[] = {0x00, 0x53, descriptor, 0xD0, 0, 0, 0, 0, 0, 0, 0, 0};
    put(head, sizeof head);
    return out_len - 8;
}
static void end_list(size_t at, uint32_t count)
{
    patch32(at, (uint32_t)(out_len - at - 4));
    patch32(at + 4, count);
}

static size_t begin_frame(uint8_t type) /* a frame on channel 0; end_frame writes its size */
{
    uint8_t head[] = {0, 0, 0, 0, 2, type, 0, 0};
    put(head, sizeof head);
    return out_len - 8;
}
static void end_frame(size_t at) { patch32(at, (uint32_t)(out_len - at)); }

static void terminus(uint8_t descriptor, const char *address) /* source 0x28, target 0x29 */
{
    size_t l = begin_list(descriptor);
    if (address) put_str(address); else put_null();
    end_list(l, 1);
}

static void durable_source(const char *address) /* durable: unsettled-state, expiry-policy: never */
{
    size_t l = begin_list(0x28);
    put_str(address);
    put_uint(2);
    text(0xA3, "never", 5);
    end_list(l, 3);
}

/* ------------------------------------------------------------------ reading AMQP values */

typedef struct { const uint8_t *p, *end; } Cursor;

static bool skip(Cursor *c);

static bool need(Cursor *c, size_t n) { return (size_t)(c->end - c->p) >= n; }
static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static bool skip(Cursor *c)
{
    if (!need(c, 1)) return false;
    uint8_t code = *c->p++;
    if (code == 0x00) return skip(c) && skip(c); /* descriptor, then the value */
    size_t n;
    switch (code >> 4) {
    case 0x4: n = 0; break;
    case 0x5: n = 1; break;
    case 0x6: n = 2; break;
    case 0x7: n = 4; break;
    case 0x8: n = 8; break;
    case 0x9: n = 16; break;
    case 0xA: case 0xC: case 0xE:
        if (!need(c, 1)) return false;
        n = 1 + c->p[0];
        break;
    case 0xB: case 0xD: case 0xF:
        if (!need(c, 4)) return false;
        n = 4 + (size_t)be32(c->p);
        break;
    default: return false;
    }
    if (!need(c, n)) return false;
    c->p += n;
    return true;
}

/* An unsigned integer (any width, or null: `absent`), advancing past it. */
static bool read_uint(Cursor *c, uint64_t *v, bool *absent)
{
    *absent = false;
    if (!need(c, 1)) return false;
    uint8_t code = *c->p;
    const uint8_t *p = c->p + 1;
    switch (code) {
    case 0x40: *absent = true; *v = 0; break;
    case 0x43: case 0x44: *v = 0; break;
    case 0x50: case 0x52: case 0x53: if (!need(c, 2)) return false; *v = p[0]; break;
    case 0x60: if (!need(c, 3)) return false; *v = (uint32_t)p[0] << 8 | p[1]; break;
    case 0x70: if (!need(c, 5)) return false; *v = be32(p); break;
    case 0x80: if (!need(c, 9)) return false; *v = (uint64_t)be32(p) << 32 | be32(p + 4); break;
    case 0x41: *v = 1; break; /* booleans read as 0/1 */
    case 0x42: *v = 0; break;
    case 0x56: if (!need(c, 2)) return false; *v = p[0]; break;
    default: return skip(c) && (*absent = true, *v = 0, true);
    }
    return skip(c);
}

/* A described list's descriptor code and its fields (`fields` left at the first, `count` of them). */
static bool open_list(Cursor *c, uint8_t *descriptor, Cursor *fields, uint32_t *count)
{
    if (!need(c, 3) || c->p[0] != 0x00) return false;
    c->p++;
    uint64_t d;
    bool absent;
    if (!read_uint(c, &d, &absent) || absent) return false;
    *descriptor = (uint8_t)d;
    if (!need(c, 1)) return false;
    uint8_t code = *c->p++;
    size_t size;
    if (code == 0x45) { *count = 0; size = 0; }
    else if (code == 0xC0 && need(c, 2)) { size = c->p[0] - 1u; *count = c->p[1]; c->p += 2; }
    else if (code == 0xD0 && need(c, 8)) { size = be32(c->p) - 4u; *count = be32(c->p + 4); c->p += 8; }
    else return false;
    if (!need(c, size)) return false;
    fields->p = c->p;
    fields->end = c->p + size;
    c->p += size;
    return true;
}

/* Field i of a list (0 when absent or null). */
static uint64_t field(Cursor fields, uint32_t count, uint32_t i, bool *absent)
{
    uint64_t v = 0;
    *absent = true;
    if (i >= count) return 0;
    for (uint32_t k = 0; k < i; k++)
        if (!skip(&fields)) return 0;
    if (!read_uint(&fields, &v, absent)) *absent = true;
    return v;
}

/* The error's condition and description from a close, end or detach's error field (index i). */
static void describe_error(const char *what, Cursor fields, uint32_t count, uint32_t i)
{
    snprintf(error_text, sizeof error_text, "%s from the broker", what);
    if (i >= count) return;
    for (uint32_t k = 0; k < i; k++)
        if (!skip(&fields)) return;
    uint8_t d;
    Cursor err;
    uint32_t n;
    if (!open_list(&fields, &d, &err, &n)) return;
    size_t used = strlen(error_text);
    for (uint32_t k = 0; k < n && k < 2 && err.p < err.end; k++) {
        uint8_t code = *err.p;
        if (code == 0xA1 || code == 0xA3) {
            used += (size_t)snprintf(error_text + used, sizeof error_text - used, ": %.*s", err.p[1], err.p + 2);
            if (used >= sizeof error_text) return;
        }
        if (!skip(&err)) return;
    }
}

/* ------------------------------------------------------------------ the connection */

static int fd = -1;
static uint8_t in[IN_SIZE];
static size_t in_len;
static int headers_expected = 1; /* protocol headers still to come (two with SASL) */
static bool sasl_done;

static double last_output_us;
static double attach_us; /* when the attach was sent */

static void flush_out(bool block)
{
    size_t sent = 0;
    if (out_len) last_output_us = now_us();
    while (sent < out_len) {
        ssize_t n = send(fd, out + sent, out_len - sent, MSG_NOSIGNAL);
        if (n > 0) { sent += (size_t)n; continue; }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!block) break;
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, 1000);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        fail("send: %s", strerror(errno));
    }
    memmove(out, out + sent, out_len - sent);
    out_len -= sent;
}

static void connect_to_broker(void)
{
    fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)opt.port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) fail("connect to port %d: %s", opt.port, strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (*opt.username) {
        headers_expected = 2;
        put("AMQP\x03\x01\x00\x00", 8);
        size_t f = begin_frame(1);
        size_t l = begin_list(SASL_INIT);
        text(0xA3, "PLAIN", 5);
        char response[512];
        int n = snprintf(response, sizeof response, "%c%s%c%s", 0, opt.username, 0, opt.password);
        if (n < 0 || n > 255) fail("user name and password too long");
        text(0xA0, response, (size_t)n);
        end_list(l, 2);
        end_frame(f);
    } else {
        sasl_done = true;
    }
    put("AMQP\x00\x01\x00\x00", 8);
    size_t f = begin_frame(0);
    size_t l = begin_list(OPEN);
    char container[256];
    if (opt.container_id) snprintf(container, sizeof container, "%s", opt.container_id);
    else snprintf(container, sizeof container, "bench-c-%s-%d", opt.role, (int)getpid());
    put_str(container);
    put_null();                                      /* hostname */
    put_uint(MAX_FRAME);                             /* max-frame-size */
    end_list(l, 3);
    end_frame(f);
    f = begin_frame(0);
    l = begin_list(BEGIN);
    put_null();         /* remote-channel */
    put_uint(0);        /* next-outgoing-id */
    put_uint(WINDOW);   /* incoming-window */
    put_uint(WINDOW);   /* outgoing-window */
    end_list(l, 4);
    end_frame(f);
    bool sender = !strcmp(opt.role, "producer");
    f = begin_frame(0);
    l = begin_list(ATTACH);
    put_str(opt.subscription ? opt.subscription : container); /* name */
    put_uint(0);                                         /* handle */
    put_bool(!sender);                                /* role: receiver = true */
    put_null();                                          /* snd-settle-mode: mixed */
    put_null();                                          /* rcv-settle-mode: first */
    if (opt.subscription && !sender) durable_source(opt.address); /* source */
    else terminus(0x28, sender ? NULL : opt.address);
    terminus(0x29, sender ? opt.address : NULL);     /* target */
    put_null();                                          /* unsettled */
    put_bool(false);                                  /* incomplete-unsettled */
    if (sender) put_uint(0); else put_null();                /* initial-delivery-count */
    end_list(l, 10);
    end_frame(f);
    attach_us = now_us();
    flush_out(true);
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) fail("fcntl: %s", strerror(errno));
}

/* ------------------------------------------------------------------ the result */

typedef struct {
    long sent, settled, accepted, released, rejected, modified, other;
    double first_send, last_send, last_settle;
} Producer;

typedef struct {
    long received, duplicates, out_of_order, stray, bad_body, redelivered, last_seq;
    double first_recv, last_recv;
    uint8_t *seen;
    double *latency, *steady; /* every message's latency; those after the warm-up */
    long steady_n;
} Consumer;

static Producer P;
static Consumer C;
static bool is_producer;

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void latency_summary(const char *name, double *v, long n)
{
    qsort(v, (size_t)n, sizeof *v, by_value);
    double sum = 0;
    for (long i = 0; i < n; i++) sum += v[i];
#define PCT(p) (n ? v[(long)fmin(n - 1, fmax(0, ceil((p) / 100.0 * n) - 1))] : 0)
    printf("\"%s\":{\"n\":%ld,\"mean_us\":%.1f,\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,"
           "\"max_us\":%.1f,\"min_us\":%.1f}", name, n, n ? sum / n : 0, PCT(50), PCT(90), PCT(99), PCT(99.9),
           n ? v[n - 1] : 0, n ? v[0] : 0);
#undef PCT
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') putchar('\\');
        if ((unsigned char)*s >= 0x20) putchar(*s);
    }
    putchar('"');
}

static void emit(int code)
{
    double cpu = cpu_us() - cpu0;
    if (is_producer) {
        double elapsed = (P.last_settle ? P.last_settle : now_us()) - P.first_send;
        printf("{\"role\":\"producer\",\"ok\":%s,\"timed_out\":%s,\"target\":%ld,\"size\":%d,\"rate_target\":%.1f,"
               "\"sent\":%ld,\"settled\":%ld,\"accepted\":%ld,\"released\":%ld,\"rejected\":%ld,\"modified\":%ld,"
               "\"other_outcome\":%ld,\"first_send_us\":%.1f,\"last_send_us\":%.1f,\"last_settle_us\":%.1f,"
               "\"send_rate\":%.1f,\"settle_rate\":%.1f,\"client_cpu_us\":%.0f,\"errors\":[",
               code == 0 ? "true" : "false", code == 2 ? "true" : "false", opt.messages, opt.size, opt.rate, P.sent,
               P.settled, P.accepted, P.released, P.rejected, P.modified, P.other, P.first_send, P.last_send,
               P.last_settle, P.sent > 1 ? (P.sent - 1) / ((P.last_send - P.first_send) / 1e6) : 0,
               P.settled > 0 && elapsed > 0 ? P.settled / (elapsed / 1e6) : 0, cpu);
    } else {
        long missing = 0;
        for (long i = 0; i < opt.messages; i++) missing += !C.seen[i];
        long n = C.received < opt.messages ? C.received : opt.messages;
        printf("{\"role\":\"consumer\",\"ok\":%s,\"timed_out\":%s,\"expected\":%ld,\"received\":%ld,\"missing\":%ld,"
               "\"duplicates\":%ld,\"out_of_order\":%ld,\"stray\":%ld,\"bad_body\":%ld,\"redelivered\":%ld,"
               "\"attach_us\":%.1f,\"first_recv_us\":%.1f,\"last_recv_us\":%.1f,\"recv_rate\":%.1f,"
               "\"warmup_messages\":%ld,",
               code == 0 ? "true" : "false", code == 2 ? "true" : "false", opt.messages, C.received, missing,
               C.duplicates, C.out_of_order, C.stray, C.bad_body, C.redelivered, attach_us, C.first_recv, C.last_recv,
               C.received > 1 ? (C.received - 1) / ((C.last_recv - C.first_recv) / 1e6) : 0, opt.warmup);
        latency_summary("latency", C.steady, C.steady_n);
        putchar(',');
        latency_summary("latency_all", C.latency, n);
        printf(",\"client_cpu_us\":%.0f,\"errors\":[", cpu);
    }
    if (*error_text) json_string(error_text);
    printf("]}\n");
    fflush(stdout);
}

/* Close the connection and wait (at most 3 s) for the broker's close, so it has every settlement. */
static void finish(int code)
{
    emit(code);
    if (fd >= 0) {
        size_t f = begin_frame(0);
        size_t l = begin_list(CLOSE);
        end_list(l, 0);
        end_frame(f);
        flush_out(true);
        double deadline = now_us() + 3e6;
        while (now_us() < deadline) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, 100) > 0) {
                ssize_t n = recv(fd, in, IN_SIZE, 0);
                if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) break;
            }
        }
        close(fd);
    }
    exit(code);
}

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
    finish(1);
}

/* ------------------------------------------------------------------ the links */

static bool attached;                 /* the broker's attach came */
static uint64_t credit_limit;         /* producer: it may send while sent < this (delivery-count + credit) */
static uint64_t peer_next_in, peer_in_window = 0; /* producer: the broker's session window */
static uint64_t next_incoming;        /* consumer: the broker's next transfer-id (one per frame) */
static uint64_t delivery_count;       /* consumer: the link's delivery-count */
static uint64_t first_unsettled;      /* consumer: the first delivery id not yet settled */
static long unsettled;                /* consumer: received, not yet settled */
static uint64_t last_received;        /* consumer: the delivery id of the last whole message */
static bool any_unsettled;
static uint64_t peer_max_frame = 0xffffffff; /* the broker's open's max-frame-size */
static double peer_idle_us;           /* the broker's idle-time-out: send something at least every half of it */
static uint8_t *template_msg;         /* producer: one message's encoding, its body at body_at */
static size_t template_len, body_at, priority_at; /* priority_at: 0 if no priority is sent */

static void send_flow(void)
{
    size_t f = begin_frame(0);
    size_t l = begin_list(FLOW);
    put_uint((uint32_t)next_incoming);    /* next-incoming-id */
    put_uint(WINDOW);                     /* incoming-window */
    put_uint(0);                          /* next-outgoing-id */
    put_uint(WINDOW);                     /* outgoing-window */
    put_uint(0);                          /* handle */
    put_uint((uint32_t)delivery_count);   /* delivery-count */
    put_uint((uint32_t)opt.credit);       /* link-credit */
    end_list(l, 7);
    end_frame(f);
}

static void settle_received(uint64_t last)
{
    size_t f = begin_frame(0);
    size_t l = begin_list(DISPOSITION);
    put_bool(true);                    /* role: receiver */
    put_uint((uint32_t)first_unsettled);  /* first */
    put_uint((uint32_t)last);             /* last */
    put_bool(true);                    /* settled */
    uint8_t accepted[] = {0x00, 0x53, ACCEPTED, 0x45};
    put(accepted, sizeof accepted);   /* state */
    end_list(l, 5);
    end_frame(f);
    first_unsettled = last + 1;
    unsettled = 0;
    any_unsettled = false;
}

/* The message in a transfer's payload: sequence number, send time, whether it was delivered before. */
static void on_message(Cursor payload)
{
    double t = now_us();
    const uint8_t *body = NULL;
    size_t body_len = 0;
    while (payload.p < payload.end && !body) {
        if (payload.p[0] != 0x00 || !need(&payload, 3)) break;
        uint8_t section = payload.p[2];
        if (section == 0x75) { /* data */
            Cursor c = {payload.p + 3, payload.end};
            if (need(&c, 2) && c.p[0] == 0xA0) { body_len = c.p[1]; body = c.p + 2; }
            else if (need(&c, 5) && c.p[0] == 0xB0) { body_len = be32(c.p + 1); body = c.p + 5; }
            if (body && !need(&c, BODY_MIN + (size_t)(body - c.p))) body = NULL; /* the rest may follow in more frames */
            break;
        }
        if (section == 0x70) { /* header: its delivery-count (field 4) says redelivered */
            Cursor h = payload, fields;
            uint8_t d;
            uint32_t count;
            bool absent;
            if (open_list(&h, &d, &fields, &count) && field(fields, count, 4, &absent) > 0) C.redelivered++;
        }
        if (!skip(&payload)) break;
    }
    if (!body || body_len < BODY_MIN) {
        C.bad_body++;
    } else {
        double sent_at;
        uint32_t seq32;
        memcpy(&sent_at, body + BODY_TS, 8);
        memcpy(&seq32, body + BODY_SEQ, 4);
        long seq = (long)seq32 - opt.seq_base;
        if (seq < 0 || seq >= opt.messages) {
            C.stray++;
            return; /* not this run's: not counted toward --messages */
        }
        if (C.seen[seq]) C.duplicates++;
        C.seen[seq] = 1;
        if (seq < C.last_seq) C.out_of_order++;
        C.last_seq = seq;
        if (C.received < opt.messages) C.latency[C.received] = t - sent_at;
        if (seq >= opt.warmup) C.steady[C.steady_n++] = t - sent_at;
    }
    if (C.received == 0) C.first_recv = t;
    C.last_recv = t;
    C.received++;
}

static void on_performative(uint8_t type, Cursor fields, uint32_t count, Cursor payload)
{
    bool absent;
    switch (type) {
    case OPEN: {
        uint64_t max = field(fields, count, 2, &absent);
        if (!absent) peer_max_frame = max;
        if (peer_max_frame < 512) fail("the broker's max-frame-size %llu is below AMQP's 512", (unsigned long long)max);
        peer_idle_us = (double)field(fields, count, 4, &absent) * 1000;
        break;
    }
    case BEGIN:
        if (is_producer) {
            peer_next_in = 0; /* our next-outgoing-id */
            peer_in_window = field(fields, count, 2, &absent);
        } else {
            next_incoming = field(fields, count, 1, &absent);
            first_unsettled = next_incoming;
        }
        break;
    case ATTACH: {
        Cursor f = fields;
        for (uint32_t k = 0; k < 5 && k < count; k++) skip(&f);
        bool no_terminus = !need(&f, 1) || f.p[0] == 0x40; /* the source (consumer) or target is null: refused */
        if (is_producer) { skip(&f); no_terminus = !need(&f, 1) || f.p[0] == 0x40; }
        if (no_terminus) break; /* a detach with the reason follows */
        attached = true;
        if (!is_producer) {
            delivery_count = field(fields, count, 9, &absent);
            printf("{\"event\":\"ready\"}\n");
            fflush(stdout);
            send_flow();
        }
        break;
    }
    case FLOW: {
        uint64_t next_in = field(fields, count, 0, &absent);
        if (is_producer) {
            peer_next_in = absent ? 0 : next_in;
            peer_in_window = field(fields, count, 1, &absent);
            field(fields, count, 4, &absent);
            if (!absent) { /* the link's credit */
                bool no_count;
                uint64_t dc = field(fields, count, 5, &no_count);
                credit_limit = (no_count ? 0 : dc) + field(fields, count, 6, &absent);
            }
        }
        break;
    }
    case DISPOSITION: {
        uint64_t first = field(fields, count, 1, &absent), last = field(fields, count, 2, &absent);
        if (absent) last = first;
        if (!field(fields, count, 3, &absent)) break; /* not settled */
        long n = (long)(last - first + 1);
        Cursor f = fields;
        for (uint32_t k = 0; k < 4 && k < count; k++) skip(&f);
        uint8_t outcome = 0;
        if (count > 4 && need(&f, 3) && f.p[0] == 0x00 && f.p[1] == 0x53) outcome = f.p[2];
        P.settled += n;
        if (outcome == ACCEPTED) P.accepted += n;
        else if (outcome == RELEASED) P.released += n;
        else if (outcome == REJECTED) P.rejected += n;
        else if (outcome == MODIFIED) P.modified += n;
        else P.other += n;
        P.last_settle = now_us();
        break;
    }
    case TRANSFER: {
        /* A message may come in several frames (more = true but the last): its first frame has the
         * delivery-id and the body's first bytes, the last one completes it. */
        static bool continuing;
        static uint64_t id;
        next_incoming++;
        if (!continuing) {
            id = field(fields, count, 1, &absent);
            on_message(payload);
        }
        continuing = field(fields, count, 5, &absent);
        if (continuing) break;
        if (!any_unsettled) { first_unsettled = id; any_unsettled = true; }
        delivery_count++;
        unsettled++;
        last_received = id;
        break;
    }
    case DETACH: describe_error("detach", fields, count, 2); finish(1); break;
    case END: describe_error("end", fields, count, 0); finish(1); break;
    case CLOSE: describe_error("close", fields, count, 0); finish(1); break;
    default: break;
    }
}

/* Every whole frame (and protocol header) in `in`. */
static void read_frames(void)
{
    size_t at = 0;
    for (;;) {
        if (headers_expected > 0) {
            if (in_len - at < 8) break;
            if (memcmp(in + at, "AMQP", 4)) fail("the broker sent no AMQP protocol header");
            at += 8;
            headers_expected--;
            continue;
        }
        if (in_len - at < 8) break;
        uint32_t size = be32(in + at);
        if (size < 8) fail("a frame of %u bytes", size);
        if (in_len - at < size) {
            if (size > IN_SIZE) fail("a frame of %u bytes, larger than the input buffer", size);
            break;
        }
        Cursor body = {in + at + in[at + 4] * 4, in + at + size};
        uint8_t frame_type = in[at + 5];
        at += size;
        if (body.p >= body.end) continue; /* heartbeat */
        uint8_t type;
        Cursor fields;
        uint32_t count;
        if (!open_list(&body, &type, &fields, &count)) fail("a frame that could not be read");
        if (frame_type == 1) {
            if (type == SASL_OUTCOME) {
                bool absent;
                uint64_t code = field(fields, count, 0, &absent);
                if (code != 0) fail("SASL authentication failed (outcome %llu)", (unsigned long long)code);
                sasl_done = true;
            }
            continue;
        }
        on_performative(type, fields, count, body);
    }
    memmove(in, in + at, in_len - at);
    in_len -= at;
}

static bool read_input(void)
{
    for (;;) {
        ssize_t n = recv(fd, in + in_len, IN_SIZE - in_len, 0);
        if (n > 0) {
            in_len += (size_t)n;
            read_frames();
            continue;
        }
        if (n == 0) fail("the broker closed the connection");
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (unsettled) { /* accept what this read brought, in one disposition, and grant again */
                settle_received(last_received);
                send_flow();
            }
            return true;
        }
        if (errno != EINTR) fail("recv: %s", strerror(errno));
    }
}

static void build_template(void)
{
    /* header: durable, then priority if sent (patched per message at priority_at) */
    uint8_t h[] = {0x00, 0x53, 0x70, 0xC0, 0x02, 0x01, opt.durable ? 0x41 : 0x42, 0x50, 0};
    size_t header = opt.priorities ? sizeof h : opt.durable ? sizeof h - 2 : 0, data = opt.size < 256 ? 5 : 8;
    if (opt.priorities) { h[4] = 0x04; h[5] = 0x02; }
    template_len = header + data + (size_t)opt.size;
    template_msg = malloc(template_len);
    uint8_t *p = template_msg;
    memcpy(p, h, header);
    p += header;
    priority_at = opt.priorities ? header - 1 : 0;
    *p++ = 0x00; *p++ = 0x53; *p++ = 0x75;
    if (opt.size < 256) { *p++ = 0xA0; *p++ = (uint8_t)opt.size; }
    else { *p++ = 0xB0; uint32_t n = (uint32_t)opt.size; *p++ = n >> 24; *p++ = n >> 16; *p++ = n >> 8; *p++ = n; }
    body_at = (size_t)(p - template_msg);
    memset(p, 'x', (size_t)opt.size);
}

static double paced_from; /* with --rate: when the first message was due */

/* With --rate, how many messages are due by now (all of them without). */
static long due(void)
{
    if (opt.rate <= 0) return opt.messages;
    if (!paced_from) paced_from = now_us();
    return (long)((now_us() - paced_from) * opt.rate / 1e6) + 1;
}

/* Transfers while credit, the session window (counted in frames), the in-flight limit, the output
 * buffer and the rate allow; a message larger than the broker's max-frame-size goes in several frames. */
static void send_what_is_allowed(void)
{
    static uint64_t frames_sent; /* our next transfer-id */
    enum { PERFORMATIVE = 30 };
    size_t chunk = (size_t)(peer_max_frame < MAX_FRAME ? peer_max_frame : MAX_FRAME) - 8 - PERFORMATIVE;
    uint64_t frames = (template_len + chunk - 1) / chunk;
    long allowed = attached ? due() : 0;
    while (attached && P.sent < opt.messages && P.sent < allowed && (uint64_t)P.sent < credit_limit
           && frames_sent + frames <= peer_next_in + peer_in_window && P.sent - P.settled < opt.inflight
           && out_len + template_len + frames * (8 + PERFORMATIVE) < out_cap / 2) {
        double t = now_us();
        uint32_t seq = (uint32_t)(P.sent + opt.seq_base), id = (uint32_t)P.sent;
        memcpy(template_msg + body_at + BODY_TS, &t, 8);
        memcpy(template_msg + body_at + BODY_SEQ, &seq, 4);
        if (priority_at) template_msg[priority_at] = (uint8_t)(P.sent % opt.priorities);
        for (size_t at = 0; at < template_len; at += chunk) {
            bool first = at == 0, more = at + chunk < template_len;
            size_t f = begin_frame(0);
            if (first) {
                uint8_t perf[] = {0x00, 0x53, TRANSFER, 0xC0, 24, 6,
                                  0x70, 0, 0, 0, 0,                            /* handle */
                                  0x70, id >> 24, id >> 16, id >> 8, id,       /* delivery-id */
                                  0xA0, 4, id >> 24, id >> 16, id >> 8, id,    /* delivery-tag */
                                  0x70, 0, 0, 0, 0,                            /* message-format */
                                  0x42,                                        /* settled: false */
                                  more ? 0x41 : 0x42};                         /* more */
                put(perf, sizeof perf);
            } else {
                uint8_t perf[] = {0x00, 0x53, TRANSFER, 0xC0, 11, 6,
                                  0x70, 0, 0, 0, 0,                            /* handle */
                                  0x40, 0x40, 0x40, 0x40,                      /* delivery-id .. settled */
                                  more ? 0x41 : 0x42};                         /* more */
                put(perf, sizeof perf);
            }
            put(template_msg + at, more ? chunk : template_len - at);
            end_frame(f);
            frames_sent++;
        }
        if (P.sent == 0) P.first_send = t;
        P.last_send = t;
        P.sent++;
    }
}

static void run(void)
{
    double deadline = now_us() + opt.timeout * 1e6;
    for (;;) {
        if (is_producer) {
            send_what_is_allowed();
            if (P.settled >= opt.messages) finish(0);
        } else if (C.received >= opt.messages) {
            flush_out(true);
            finish(C.duplicates || C.bad_body ? 1 : 0);
        }
        if (peer_idle_us > 0 && !out_len && now_us() - last_output_us > peer_idle_us / 2) {
            uint8_t heartbeat[] = {0, 0, 0, 8, 2, 0, 0, 0}; /* an empty frame */
            put(heartbeat, sizeof heartbeat);
        }
        if (out_len) flush_out(false);
        if (now_us() > deadline) {
            snprintf(error_text, sizeof error_text, "timeout after %d s", opt.timeout);
            finish(2);
        }
        struct pollfd p = {.fd = fd, .events = POLLIN | (out_len ? POLLOUT : 0)};
        double wait_us = 250e3;
        if (is_producer && opt.rate > 0 && paced_from && P.sent < opt.messages) { /* until the next is due */
            double next = paced_from + P.sent * 1e6 / opt.rate - now_us();
            wait_us = next < 0 ? 0 : next < wait_us ? next : wait_us;
        }
        struct timespec ts = {.tv_sec = (time_t)(wait_us / 1e6), .tv_nsec = (long)(fmod(wait_us, 1e6) * 1e3)};
        if (ppoll(&p, 1, &ts, NULL) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) read_input();
    }
}

int main(int argc, char **argv)
{
    cpu0 = cpu_us();
    if (argc < 2 || (strcmp(argv[1], "producer") && strcmp(argv[1], "consumer"))) {
        fprintf(stderr, "usage: client producer|consumer --port P --address A --messages N [options]\n");
        return 2;
    }
    opt.role = argv[1];
    is_producer = !strcmp(opt.role, "producer");
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--durable")) { opt.durable = true; continue; }
        if (!v) { fprintf(stderr, "%s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--host")) opt.host = v;
        else if (!strcmp(a, "--port")) opt.port = atoi(v);
        else if (!strcmp(a, "--address")) opt.address = v;
        else if (!strcmp(a, "--messages")) opt.messages = atol(v);
        else if (!strcmp(a, "--size")) opt.size = atoi(v);
        else if (!strcmp(a, "--inflight")) opt.inflight = atoi(v);
        else if (!strcmp(a, "--credit")) opt.credit = atoi(v);
        else if (!strcmp(a, "--seq-base")) opt.seq_base = atol(v);
        else if (!strcmp(a, "--priorities")) opt.priorities = atoi(v);
        else if (!strcmp(a, "--timeout")) opt.timeout = atoi(v);
        else if (!strcmp(a, "--username")) opt.username = v;
        else if (!strcmp(a, "--password")) opt.password = v;
        else if (!strcmp(a, "--container-id") && strlen(v) < 256) opt.container_id = v;
        else if (!strcmp(a, "--subscription") && strlen(v) < 256) opt.subscription = v;
        else if (!strcmp(a, "--warmup")) opt.warmup = atol(v);
        else if (!strcmp(a, "--rate")) opt.rate = atof(v);
        else if (!strcmp(a, "--duration")) opt.duration = atof(v);
        else if (!strcmp(a, "--stall")) continue;
        else { fprintf(stderr, "unknown option %s %s\n", a, v); return 2; }
    }
    if (opt.rate > 0 && opt.duration > 0) opt.messages = lround(opt.rate * opt.duration);
    if (strcmp(opt.host, "127.0.0.1") && strcmp(opt.host, "localhost")) {
        fprintf(stderr, "this benchmark only talks to the loopback address\n");
        return 2;
    }
    if (opt.size < BODY_MIN || opt.messages < 1 || opt.credit < 1 || opt.inflight < 1 || opt.priorities < 0
        || opt.priorities > 256) {
        fprintf(stderr, "--size must be at least %d, --messages, --credit and --inflight at least 1, --priorities 0-256\n", BODY_MIN);
        return 2;
    }
    out_cap = (size_t)opt.size * 4 + (1 << 20);
    out = malloc(out_cap);
    if (is_producer) build_template();
    else {
        C.seen = calloc((size_t)opt.messages, 1);
        C.latency = malloc(sizeof(double) * (size_t)opt.messages);
        C.steady = malloc(sizeof(double) * (size_t)opt.messages);
        C.last_seq = -1;
    }
    connect_to_broker();
    run();
}

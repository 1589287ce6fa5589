// What proton C++'s own reconnect does when a broker closes its connection: connects to the first URL given,
// the others as its failover URLs (no SASL layer), for MS milliseconds, and prints one JSON line per event:
// {"opened": "<remote container-id>"} for each open it received, {"closed": "<condition>"} for each
// connection the broker ended with an error (whether the reconnect goes on shows in what follows).
// It ends at the deadline, or at the first open from a broker named WANTED.
//   reconnect MS WANTED URL [URL...]
#include <proton/connection.hpp>
#include <proton/connection_options.hpp>
#include <proton/container.hpp>
#include <proton/error_condition.hpp>
#include <proton/messaging_handler.hpp>
#include <proton/reconnect_options.hpp>
#include <proton/transport.hpp>
#include <proton/work_queue.hpp>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

void print(const std::string& key, const std::string& value) {
    std::cout << "{\"" << key << "\": \"" << value << "\"}" << std::endl;
}

class Reconnecting : public proton::messaging_handler {
  public:
    Reconnecting(int ms, std::string wanted, std::vector<std::string> urls)
        : ms_(ms), wanted_(std::move(wanted)), urls_(std::move(urls)) {}

    void on_container_start(proton::container& c) override {
        proton::reconnect_options again;
        again.delay(proton::duration(100)).max_delay(proton::duration(200));
        proton::connection_options options;
        options.sasl_enabled(false).reconnect(again)
            .failover_urls(std::vector<std::string>(urls_.begin() + 1, urls_.end()));
        c.connect(urls_.front(), options);
        c.schedule(proton::duration(ms_), [&c]() { c.stop(); });
    }

    void on_connection_open(proton::connection& conn) override {
        print("opened", conn.container_id());
        if (conn.container_id() == wanted_) {
            done_ = true;
            conn.container().stop();
        }
    }

    // A broker's close with an error reaches the handler as the connection's error, or, when the reconnect
    // goes on from it, as the transport's.
    void on_connection_error(proton::connection& conn) override {
        if (!done_) print("closed", conn.error().name());
    }

    void on_transport_error(proton::transport& t) override {
        if (!done_) print("closed", t.error().name());
    }

  private:
    int ms_;
    bool done_ = false;  // stopping: what the stop itself does to the connection is not the broker's
    std::string wanted_;
    std::vector<std::string> urls_;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) {
        std::cerr << "usage: reconnect MS WANTED URL [URL...]" << std::endl;
        return 2;
    }
    Reconnecting handler(std::atoi(argv[1]), argv[2], std::vector<std::string>(argv + 3, argv + argc));
    proton::container(handler, "cpp-reconnect").run();
    return 0;
}

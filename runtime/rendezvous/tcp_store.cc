// KeyValueStore over LibTorch's c10d::TCPStore (the store torchrun uses), so that the same
// store also bootstraps c10d process groups (see transport/gloo).
#include <algorithm>
#include <chrono>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "runtime/rendezvous/c10d_store.h"

namespace pipetrain::rendezvous {
namespace {

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(std::max<int64_t>(1, absl::ToInt64Milliseconds(d)));
}

class TcpStore : public KeyValueStore, public C10dStoreHolder {
 public:
  TcpStore(c10::intrusive_ptr<c10d::TCPStore> store, bool server)
      : store_(std::move(store)), server_(server) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    try {
      store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
      // c10d's set is not answered: a process that exits right after it (a stage that
      // published its last loss) may leave the value unread in the server's socket while
      // the launcher looks for it. The server answers one connection's requests in order,
      // so the answer to this check means the set before it has been applied.
      (void)store_->check({key});
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("store: set '", key, "': ", FirstLine(e)));
    }
  }
  // Polls with check() rather than c10d's wait(): a wait() that times out on the client
  // leaves the server's later answer on the connection, and every reply after it is read
  // out of step (a wrong value, or a read that never returns).
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    absl::Duration pause = absl::Milliseconds(1);
    try {
      while (!store_->check({key})) {
        const absl::Duration left = deadline - absl::Now();
        if (left <= absl::ZeroDuration()) {
          return absl::DeadlineExceededError(absl::StrCat(
              "store: '", key, "' was not set within ", absl::FormatDuration(timeout)));
        }
        absl::SleepFor(std::min(pause, left));
        pause = std::min(pause * 2, absl::Milliseconds(20));
      }
      std::vector<uint8_t> v = store_->get(key);  // set: answers at once
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("store: get '", key, "': ", FirstLine(e)));
    }
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    try {
      return store_->add(key, delta);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("store: add '", key, "': ", FirstLine(e)));
    }
  }
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys) override {
    try {
      return store_->check(keys);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("store: check: ", FirstLine(e)));
    }
  }
  absl::Status Delete(const std::string& key) override {
    try {
      store_->deleteKey(key);
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("store: delete '", key, "': ", FirstLine(e)));
    }
  }
  c10::intrusive_ptr<c10d::Store> c10d_store() const override { return store_; }
  int port() const { return server_ ? store_->getPort() : -1; }

 private:
  c10::intrusive_ptr<c10d::TCPStore> store_;
  bool server_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KeyValueStore>> ServeTcpStore(const std::string& host, int port) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = std::chrono::seconds(60);
  try {
    return std::unique_ptr<KeyValueStore>(
        new TcpStore(c10::make_intrusive<c10d::TCPStore>(host, o), /*server=*/true));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve a store on ", host, ":", port, ": ", FirstLine(e)));
  }
}

absl::StatusOr<std::unique_ptr<KeyValueStore>> ConnectTcpStore(const std::string& host, int port,
                                                               absl::Duration timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = ToChrono(timeout);
  try {
    return std::unique_ptr<KeyValueStore>(
        new TcpStore(c10::make_intrusive<c10d::TCPStore>(host, o), /*server=*/false));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot reach the store at ", host, ":", port,
                                               " within ", absl::FormatDuration(timeout), ": ",
                                               FirstLine(e)));
  }
}

int TcpStorePort(const KeyValueStore& store) {
  const auto* tcp = dynamic_cast<const TcpStore*>(&store);
  return tcp ? tcp->port() : -1;
}

}  // namespace pipetrain::rendezvous

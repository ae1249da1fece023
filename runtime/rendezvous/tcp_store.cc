// KeyValueStore over LibTorch's c10d::TCPStore (the store torchrun uses), so that the same
// store also bootstraps c10d process groups (see transport/gloo).
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "absl/strings/escaping.h"
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
          return absl::DeadlineExceededError(absl::StrCat("store: '", key, "' was not set within ",
                                                          absl::FormatDuration(timeout)));
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

// What a server that answered, but not as a store, sent first: named when it is a protocol
// one meets at wrong ports, else shown as hex.
std::string DescribeAnswer(const std::string& bytes) {
  if (bytes.empty()) return "it closed the connection without an answer";
  // An HTTP/2 frame header (gRPC): 3 bytes of length, then type 4 (SETTINGS) or 7 (GOAWAY).
  if (bytes.size() >= 9 && bytes[0] == 0 && (bytes[3] == 4 || bytes[3] == 7)) {
    return "it speaks HTTP/2 (a gRPC server, such as a coordinator's or a worker's?)";
  }
  if (bytes.rfind("HTTP/", 0) == 0) return "it speaks HTTP (a web or metrics server?)";
  if (bytes.rfind("SSH-", 0) == 0) return "it is an SSH server";
  return absl::StrCat("it answered ", bytes.size(), " bytes a store never sends (",
                      absl::BytesToHexString(bytes.substr(0, 16)),
                      bytes.size() > 16 ? "...)" : ")");
}

// Whether a c10d store serves host:port, asked by `deadline`: OK once a server there answers
// a CHECK of a key nobody sets as a store does (one byte, READY or NOT_READY); Unavailable
// if nothing accepts connections there by the deadline (retried until then: the other side
// may not be listening yet); FailedPrecondition naming the address and what answered instead
// (a gRPC port, say),
// or saying that nothing was answered within 5 s. (c10d's own client would wait out its
// timeout on such a server, and its threads could end the process.)
absl::Status ProbeStore(const std::string& host, int port, absl::Time deadline) {
  const std::string where = absl::StrCat(host, ":", port);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int e = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
      e != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve ", where, ": ", gai_strerror(e)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, freeaddrinfo);
  const std::string not_a_store = absl::StrCat(where, " is not a store of pipetrain's: ");
  std::string last_error = "nothing answered";
  while (true) {
    for (addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      struct Closer {
        int fd;
        ~Closer() { close(fd); }
      } closer{fd};
      if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        continue;
      }
      // CHECK (query 4) of one key: the count and the key's length as uint64, then the key.
      const std::string key = "pipetrain/probe";
      std::string query(1, '\x04');
      const uint64_t count = 1, length = key.size();
      query.append(reinterpret_cast<const char*>(&count), sizeof(count));
      query.append(reinterpret_cast<const char*>(&length), sizeof(length));
      query += key;
      if (send(fd, query.data(), query.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(query.size())) {
        return absl::FailedPreconditionError(
            absl::StrCat(not_a_store, "it closed the connection at once"));
      }
      // The answer: what arrives within 5 s, and whatever follows it within 50 ms.
      std::string answer;
      const absl::Time answer_by = std::min(deadline, absl::Now() + absl::Seconds(5));
      bool closed = false;
      while (answer.size() <= 64) {
        const absl::Duration left =
            answer.empty() ? answer_by - absl::Now() : absl::Milliseconds(50);
        if (left <= absl::ZeroDuration()) break;
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) break;
        char buf[256];
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) {
          closed = true;
          break;
        }
        answer.append(buf, static_cast<size_t>(n));
      }
      if (answer.size() == 1 && (answer[0] == 0 || answer[0] == 1)) return absl::OkStatus();
      if (answer.empty() && !closed) {
        return absl::FailedPreconditionError(absl::StrCat(
            not_a_store, "it accepted the connection but answered no store's query within 5 s"));
      }
      return absl::FailedPreconditionError(absl::StrCat(not_a_store, DescribeAnswer(answer)));
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("nothing accepts connections there (", last_error, ")"));
    }
    absl::SleepFor(std::min(absl::Milliseconds(100), deadline - absl::Now()));
  }
}

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
  const absl::Time deadline = absl::Now() + timeout;
  if (absl::Status probed = ProbeStore(host, port, deadline); !probed.ok()) {
    if (!absl::IsUnavailable(probed)) return probed;
    return absl::UnavailableError(absl::StrCat("cannot reach the store at ", host, ":", port,
                                               " within ", absl::FormatDuration(timeout), ": ",
                                               probed.message()));
  }
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  // Also every later call's. c10d 1.13 counts its connect timeout in whole seconds: under
  // one second it gives up before it tries (the probe above bounds the connect anyway).
  o.timeout = ToChrono(std::max(timeout, absl::Seconds(1)));
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

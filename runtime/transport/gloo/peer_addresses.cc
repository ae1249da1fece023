// Where a job's Gloo ranks listen, and what a failure to connect says of them. See
// peer_addresses.h.
#include "runtime/transport/gloo/peer_addresses.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::transport {
namespace {

std::string AddressKey(int rank) { return absl::StrCat("gloo/address/", rank); }

}  // namespace

absl::Status PublishListenAddress(rendezvous::KeyValueStore& store, int rank,
                                  const std::string& host) {
  return store.Set(AddressKey(rank), host);
}

std::string PeersNamed(rendezvous::KeyValueStore& store, const std::string& error, int rank,
                       int world, const std::function<std::string(int)>& describe) {
  std::vector<std::pair<int, std::string>> peers;
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    absl::StatusOr<std::string> address = store.Get(AddressKey(r), absl::Milliseconds(100));
    if (address.ok()) peers.push_back({r, *address});
  }
  auto unreached = [&](int r, const std::string& address) {
    return absl::StrCat("; it could not reach ", describe(r), " at ", address,
                        " (the address that rank's worker advertises: --advertise-address or "
                        "--iface; is it one this host reaches?)");
  };
  for (const auto& [r, address] : peers) {
    if (error.find(absl::StrCat("[", address, "]")) != std::string::npos ||
        error.find(absl::StrCat(address, ":")) != std::string::npos) {
      return unreached(r, address);
    }
  }
  if (peers.size() == 1 && world == 2) return unreached(peers[0].first, peers[0].second);
  std::vector<std::string> all;
  for (const auto& [r, address] : peers) all.push_back(absl::StrCat(describe(r), " at ", address));
  if (all.empty()) return "";
  return absl::StrCat("; its peers listen at: ", absl::StrJoin(all, ", "));
}

}  // namespace pipetrain::transport

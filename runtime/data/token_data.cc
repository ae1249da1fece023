// Token datasets: the synthetic Markov corpus and the byte / uint16 token files, all served
// as non-overlapping windows of T+1 tokens with stride T.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/regular_file.h"
#include "runtime/base/status_macros.h"
#include "runtime/data/dataset.h"
#include "runtime/data/rng.h"

namespace pipetrain::data {
namespace {

// Windows over an in-memory token sequence stored as `Token` (uint8_t, uint16_t or int32_t).
// Sample k is tokens [k*T, k*T + T]: inputs are the first T, targets the last T.
template <typename Token>
class TokenWindowDataset final : public Dataset {
 public:
  TokenWindowDataset(std::vector<Token> tokens, int64_t vocab, int64_t seq_len,
                     std::string description, std::optional<double> entropy)
      : tokens_(std::move(tokens)),
        vocab_(vocab),
        seq_len_(seq_len),
        num_samples_((static_cast<int64_t>(tokens_.size()) - 1) / seq_len),
        description_(std::move(description)),
        entropy_(entropy) {}

  std::string Describe() const override { return description_; }
  int64_t num_samples() const override { return num_samples_; }
  int64_t num_classes() const override { return vocab_; }
  std::vector<int64_t> sample_shape() const override { return {seq_len_}; }
  bool is_token_data() const override { return true; }
  std::optional<double> entropy_nats() const override { return entropy_; }

  MicroBatch Read(const std::vector<int64_t>& sample_ids) const override {
    const int64_t rows = static_cast<int64_t>(sample_ids.size());
    MicroBatch batch;
    batch.input_shape = {rows, seq_len_};
    batch.target_shape = {rows, seq_len_};
    batch.input_tokens.resize(static_cast<size_t>(rows * seq_len_));
    batch.targets.resize(static_cast<size_t>(rows * seq_len_));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = sample_ids[static_cast<size_t>(r)];
      if (id < 0 || id >= num_samples_) {
        internal::Fatal(absl::StrCat("Read: sample id ", id, " out of range [0, ", num_samples_,
                                     ") of ", description_));
      }
      const Token* window = tokens_.data() + id * seq_len_;
      int64_t* inputs = batch.input_tokens.data() + r * seq_len_;
      int64_t* targets = batch.targets.data() + r * seq_len_;
      for (int64_t t = 0; t < seq_len_; ++t) {
        inputs[t] = static_cast<int64_t>(window[t]);
        targets[t] = static_cast<int64_t>(window[t + 1]);
      }
    }
    return batch;
  }

 private:
  const std::vector<Token> tokens_;
  const int64_t vocab_;
  const int64_t seq_len_;
  const int64_t num_samples_;
  const std::string description_;
  const std::optional<double> entropy_;
};

absl::Status ValidateWindow(const TokenDataOptions& opts) {
  if (opts.seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("seq_len must be >= 1, got ", opts.seq_len));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------
// Synthetic Markov corpus.

// Transition structure: state s moves to successors[s*B + j] with probability probs[s*B + j].
struct MarkovChain {
  int64_t vocab = 0;
  int64_t branching = 0;
  std::vector<int64_t> successors;
  std::vector<double> probs;
  std::vector<double> cumulative;  // per state, inclusive prefix sums; the last is exactly 1
};

// Successors of s: (s+1) mod V first (so the chain is irreducible), then branching-1 more
// distinct states drawn uniformly from the rest (s itself included). Probabilities are
// w_j / sum(w), w_j = 0.1 + Exp(1): a Dirichlet-like spread kept away from zero so that
// every transition, in particular the connecting one, is seen often.
MarkovChain BuildChain(int64_t vocab, int64_t branching, internal::Rng& rng) {
  MarkovChain chain;
  chain.vocab = vocab;
  chain.branching = branching;
  const size_t total = static_cast<size_t>(vocab * branching);
  chain.successors.resize(total);
  chain.probs.resize(total);
  chain.cumulative.resize(total);
  const bool dense = 2 * branching > vocab;
  std::vector<char> taken(static_cast<size_t>(vocab), 0);
  std::vector<int64_t> pool;
  for (int64_t s = 0; s < vocab; ++s) {
    int64_t* succ = chain.successors.data() + s * branching;
    const int64_t next = (s + 1) % vocab;
    succ[0] = next;
    if (dense) {
      // Partial Fisher-Yates over every state except `next`.
      pool.clear();
      for (int64_t v = 0; v < vocab; ++v) {
        if (v != next) pool.push_back(v);
      }
      for (int64_t j = 1; j < branching; ++j) {
        const size_t remaining = pool.size() - static_cast<size_t>(j - 1);
        const size_t pick = static_cast<size_t>(j - 1) + rng.UniformInt(remaining);
        std::swap(pool[static_cast<size_t>(j - 1)], pool[pick]);
        succ[j] = pool[static_cast<size_t>(j - 1)];
      }
    } else {
      // Rejection: at most half the states are taken, so each draw succeeds w.p. >= 1/2.
      taken[static_cast<size_t>(next)] = 1;
      for (int64_t j = 1; j < branching; ++j) {
        int64_t v;
        do {
          v = static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(vocab)));
        } while (taken[static_cast<size_t>(v)]);
        taken[static_cast<size_t>(v)] = 1;
        succ[j] = v;
      }
      for (int64_t j = 0; j < branching; ++j) taken[static_cast<size_t>(succ[j])] = 0;
    }
    double* p = chain.probs.data() + s * branching;
    double sum = 0.0;
    for (int64_t j = 0; j < branching; ++j) {
      p[j] = 0.1 - std::log(1.0 - rng.Uniform());
      sum += p[j];
    }
    double* cum = chain.cumulative.data() + s * branching;
    double acc = 0.0;
    for (int64_t j = 0; j < branching; ++j) {
      p[j] /= sum;
      acc += p[j];
      cum[j] = acc;
    }
    cum[branching - 1] = 1.0;
  }
  return chain;
}

// Stationary distribution by power iteration of the lazy chain (I + P) / 2, which has the
// same stationary distribution as P and converges for any irreducible P, periodic or not.
absl::StatusOr<std::vector<double>> StationaryDistribution(const MarkovChain& chain) {
  const int64_t V = chain.vocab;
  const int64_t B = chain.branching;
  std::vector<double> pi(static_cast<size_t>(V), 1.0 / static_cast<double>(V));
  std::vector<double> next(static_cast<size_t>(V));
  constexpr int kMaxIterations = 10'000'000;
  constexpr double kTolerance = 1e-12;
  for (int iter = 0; iter < kMaxIterations; ++iter) {
    for (int64_t v = 0; v < V; ++v) next[static_cast<size_t>(v)] = 0.5 * pi[static_cast<size_t>(v)];
    for (int64_t s = 0; s < V; ++s) {
      const double mass = 0.5 * pi[static_cast<size_t>(s)];
      for (int64_t j = 0; j < B; ++j) {
        const size_t k = static_cast<size_t>(s * B + j);
        next[static_cast<size_t>(chain.successors[k])] += mass * chain.probs[k];
      }
    }
    double sum = 0.0;
    for (double x : next) sum += x;
    double diff = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      next[static_cast<size_t>(v)] /= sum;
      diff += std::abs(next[static_cast<size_t>(v)] - pi[static_cast<size_t>(v)]);
    }
    pi.swap(next);
    if (diff < kTolerance) return pi;
  }
  return absl::InternalError(absl::StrCat("stationary distribution of the Markov chain (vocab ", V,
                                          ", branching ", B, ") did not converge in ",
                                          kMaxIterations, " iterations"));
}

// Entropy rate sum_s pi(s) H(P(.|s)) in nats.
double EntropyRate(const MarkovChain& chain, const std::vector<double>& pi) {
  double h = 0.0;
  for (int64_t s = 0; s < chain.vocab; ++s) {
    double hs = 0.0;
    for (int64_t j = 0; j < chain.branching; ++j) {
      const double p = chain.probs[static_cast<size_t>(s * chain.branching + j)];
      if (p > 0.0) hs -= p * std::log(p);
    }
    h += pi[static_cast<size_t>(s)] * hs;
  }
  return h;
}

// Index i with cum[i-1] <= u < cum[i] (cum[-1] = 0); cum's last entry is 1 > u.
int64_t SampleIndex(const double* cum, int64_t n, double u) {
  return static_cast<int64_t>(std::upper_bound(cum, cum + n, u) - cum);
}

template <typename Token>
std::unique_ptr<Dataset> GenerateCorpus(const SyntheticCorpusOptions& opts,
                                        const MarkovChain& chain, const std::vector<double>& pi,
                                        double entropy, internal::Rng& rng) {
  std::vector<double> pi_cum(pi.size());
  double acc = 0.0;
  for (size_t v = 0; v < pi.size(); ++v) pi_cum[v] = (acc += pi[v]);
  pi_cum.back() = 1.0;

  std::vector<Token> tokens(static_cast<size_t>(opts.num_tokens));
  // The first token is drawn from pi, so the whole sequence is stationary.
  int64_t state = SampleIndex(pi_cum.data(), opts.vocab, rng.Uniform());
  tokens[0] = static_cast<Token>(state);
  for (int64_t n = 1; n < opts.num_tokens; ++n) {
    const int64_t j = SampleIndex(chain.cumulative.data() + state * opts.branching, opts.branching,
                                  rng.Uniform());
    state = chain.successors[static_cast<size_t>(state * opts.branching + j)];
    tokens[static_cast<size_t>(n)] = static_cast<Token>(state);
  }
  std::string description =
      absl::StrCat("synthetic markov corpus (vocab ", opts.vocab, ", ", opts.num_tokens,
                   " tokens, seq ", opts.window.seq_len, ")");
  return std::make_unique<TokenWindowDataset<Token>>(
      std::move(tokens), opts.vocab, opts.window.seq_len, std::move(description), entropy);
}

// ---------------------------------------------------------------------------------------
// Token files.

// The whole file as bytes, at most kMaxTokenFileBytes (data/token_data.h).
absl::StatusOr<std::vector<uint8_t>> ReadWholeFile(const std::string& path, const char* what) {
  std::vector<uint8_t> bytes;
  PT_RETURN_IF_ERROR(ReadRegularFile(path, kMaxTokenFileBytes, what, &bytes));
  return bytes;
}

absl::Status CheckLongEnough(const std::string& path, const char* what, int64_t num_tokens,
                             int64_t seq_len) {
  if (num_tokens < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", path, "' has ", num_tokens,
                                                   " tokens, too short for one window of seq_len ",
                                                   seq_len, " + 1 = ", seq_len + 1, " tokens"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> MakeSyntheticCorpus(const SyntheticCorpusOptions& opts) {
  PT_RETURN_IF_ERROR(ValidateWindow(opts.window));
  if (opts.vocab < 2 || opts.vocab > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic corpus: vocab must be in [2, 2^31), got ", opts.vocab));
  }
  if (opts.branching < 1 || opts.branching > opts.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("synthetic corpus: branching must be in [1, vocab = ", opts.vocab, "], got ",
                     opts.branching));
  }
  if (opts.num_tokens < opts.window.seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic corpus: num_tokens ", opts.num_tokens,
                                                   " is too short for one window of seq_len ",
                                                   opts.window.seq_len, " + 1 tokens"));
  }
  // Independent streams for the chain's structure and for the token sequence.
  internal::Rng chain_rng(internal::HashPair(opts.seed, 0x636861696E /* "chain" */));
  const MarkovChain chain = BuildChain(opts.vocab, opts.branching, chain_rng);
  PT_ASSIGN_OR_RETURN(const std::vector<double> pi, StationaryDistribution(chain));
  const double entropy = EntropyRate(chain, pi);
  internal::Rng token_rng(internal::HashPair(opts.seed, 0x746F6B656E /* "token" */));
  if (opts.vocab <= 65536) {
    return GenerateCorpus<uint16_t>(opts, chain, pi, entropy, token_rng);
  }
  return GenerateCorpus<int32_t>(opts, chain, pi, entropy, token_rng);
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenByteFile(const std::string& path,
                                                      const TokenDataOptions& opts) {
  PT_RETURN_IF_ERROR(ValidateWindow(opts));
  PT_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, ReadWholeFile(path, "byte file"));
  const int64_t num_tokens = static_cast<int64_t>(bytes.size());
  PT_RETURN_IF_ERROR(CheckLongEnough(path, "byte file", num_tokens, opts.seq_len));
  std::string description = absl::StrCat("byte file '", path, "' (vocab 256, ", num_tokens,
                                         " tokens, seq ", opts.seq_len, ")");
  return std::unique_ptr<Dataset>(std::make_unique<TokenWindowDataset<uint8_t>>(
      std::move(bytes), 256, opts.seq_len, std::move(description), std::nullopt));
}

absl::StatusOr<std::unique_ptr<Dataset>> OpenUint16TokenFile(const std::string& path,
                                                             const TokenDataOptions& opts,
                                                             int64_t vocab) {
  PT_RETURN_IF_ERROR(ValidateWindow(opts));
  if (vocab < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "uint16 token file '", path, "': vocab must be >= 0 (0: inferred), got ", vocab));
  }
  PT_ASSIGN_OR_RETURN(const std::vector<uint8_t> bytes, ReadWholeFile(path, "uint16 token file"));
  if (bytes.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("uint16 token file '", path, "' has odd length ", bytes.size(),
                     " bytes; expected little-endian uint16 token ids"));
  }
  std::vector<uint16_t> tokens(bytes.size() / 2);
  int64_t max_id = -1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint16_t id = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
    if (vocab > 0 && id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("uint16 token file '", path, "': token id ",
                                                     id, " at byte offset ", 2 * i, " (token ", i,
                                                     ") is >= vocab ", vocab));
    }
    max_id = std::max<int64_t>(max_id, id);
    tokens[i] = id;
  }
  const int64_t num_tokens = static_cast<int64_t>(tokens.size());
  PT_RETURN_IF_ERROR(CheckLongEnough(path, "uint16 token file", num_tokens, opts.seq_len));
  const int64_t effective_vocab = vocab > 0 ? vocab : max_id + 1;
  std::string description = absl::StrCat("uint16 token file '", path, "' (vocab ", effective_vocab,
                                         ", ", num_tokens, " tokens, seq ", opts.seq_len, ")");
  return std::unique_ptr<Dataset>(std::make_unique<TokenWindowDataset<uint16_t>>(
      std::move(tokens), effective_vocab, opts.seq_len, std::move(description), std::nullopt));
}

}  // namespace pipetrain::data

#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/data/dataset.h"

namespace pipetrain::data {
namespace {

std::vector<int64_t> AllIds(const Dataset& ds) {
  std::vector<int64_t> ids(static_cast<size_t>(ds.num_samples()));
  std::iota(ids.begin(), ids.end(), int64_t{0});
  return ids;
}

// The token sequence covered by the windows: sample k's inputs, then the last target.
std::vector<int64_t> CoveredTokens(const Dataset& ds) {
  const MicroBatch batch = ds.Read(AllIds(ds));
  std::vector<int64_t> tokens = batch.input_tokens;
  tokens.push_back(batch.targets.back());
  return tokens;
}

// Empirical conditional entropy H(X_{n+1} | X_n) in nats from bigram counts.
double EmpiricalEntropy(const std::vector<int64_t>& tokens) {
  std::map<std::pair<int64_t, int64_t>, int64_t> bigrams;
  std::map<int64_t, int64_t> unigrams;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    ++bigrams[{tokens[i], tokens[i + 1]}];
    ++unigrams[tokens[i]];
  }
  const double n = static_cast<double>(tokens.size() - 1);
  double h = 0.0;
  for (const auto& [pair, count] : bigrams) {
    const double c = static_cast<double>(count);
    h -= c / n * std::log(c / static_cast<double>(unigrams[pair.first]));
  }
  return h;
}

TEST(SyntheticCorpusTest, ShapesAndDescription) {
  SyntheticCorpusOptions opts;
  auto ds = MakeSyntheticCorpus(opts);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const Dataset& d = **ds;
  EXPECT_TRUE(d.is_token_data());
  EXPECT_EQ(d.num_classes(), 64);
  EXPECT_EQ(d.sample_shape(), std::vector<int64_t>{32});
  EXPECT_EQ(d.num_samples(), ((int64_t{1} << 20) - 1) / 32);
  EXPECT_EQ(d.Describe(), "synthetic markov corpus (vocab 64, 1048576 tokens, seq 32)");

  const MicroBatch batch = d.Read({0, 5, d.num_samples() - 1});
  EXPECT_EQ(batch.input_shape, (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(batch.target_shape, (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(batch.input_tokens.size(), 96u);
  EXPECT_EQ(batch.targets.size(), 96u);
  EXPECT_TRUE(batch.input_values.empty());
  for (int64_t t : batch.input_tokens) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 64);
  }
}

TEST(SyntheticCorpusTest, TargetsAreInputsShiftedByOne) {
  SyntheticCorpusOptions opts;
  opts.num_tokens = 10'000;
  opts.window.seq_len = 16;
  auto ds = MakeSyntheticCorpus(opts);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const int64_t T = 16;
  EXPECT_EQ((*ds)->num_samples(), (10'000 - 1) / 16);
  for (int64_t k = 0; k + 1 < (*ds)->num_samples(); ++k) {
    const MicroBatch b = (*ds)->Read({k, k + 1});
    for (int64_t t = 0; t + 1 < T; ++t) EXPECT_EQ(b.targets[t], b.input_tokens[t + 1]);
    // Windows overlap by one token: the last target of k is the first input of k+1.
    EXPECT_EQ(b.targets[T - 1], b.input_tokens[T]);
  }
}

TEST(SyntheticCorpusTest, SameSeedSameDataDifferentSeedDifferentData) {
  SyntheticCorpusOptions opts;
  opts.num_tokens = 50'000;
  auto a = MakeSyntheticCorpus(opts);
  auto b = MakeSyntheticCorpus(opts);
  opts.seed = 1235;
  auto c = MakeSyntheticCorpus(opts);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const std::vector<int64_t> ta = CoveredTokens(**a);
  EXPECT_EQ(ta, CoveredTokens(**b));
  EXPECT_EQ(*(*a)->entropy_nats(), *(*b)->entropy_nats());
  const std::vector<int64_t> tc = CoveredTokens(**c);
  ASSERT_EQ(ta.size(), tc.size());
  int64_t same = 0;
  for (size_t i = 0; i < ta.size(); ++i) same += ta[i] == tc[i];
  // Independent sequences agree on about sum_s pi_a(s) pi_c(s) ~ 1/64 of positions.
  EXPECT_LT(same, static_cast<int64_t>(ta.size()) / 10);
  EXPECT_NE(*(*a)->entropy_nats(), *(*c)->entropy_nats());
}

// Pins the generator so that a change to the RNG or the chain construction (which would
// change every experiment's data) is noticed.
TEST(SyntheticCorpusTest, GoldenValues) {
  auto ds = MakeSyntheticCorpus(SyntheticCorpusOptions{});
  ASSERT_TRUE(ds.ok()) << ds.status();
  const MicroBatch b = (*ds)->Read({0});
  const std::vector<int64_t> first(b.input_tokens.begin(), b.input_tokens.begin() + 12);
  std::cout.precision(17);
  std::cout << "default corpus: entropy " << *(*ds)->entropy_nats() << " nats; first tokens";
  for (int64_t t : first) std::cout << " " << t;
  std::cout << "\n";
  EXPECT_EQ(first, (std::vector<int64_t>{48, 6, 17, 38, 39, 36, 31, 41, 42, 46, 14, 60}));
  EXPECT_NEAR(*(*ds)->entropy_nats(), 1.1648855399555866, 1e-9);
}

TEST(SyntheticCorpusTest, EntropyMatchesEmpiricalBigramEntropy) {
  SyntheticCorpusOptions opts;  // vocab 64, branching 4, 1 << 20 tokens
  auto ds = MakeSyntheticCorpus(opts);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const std::optional<double> h = (*ds)->entropy_nats();
  ASSERT_TRUE(h.has_value());
  EXPECT_GT(*h, 0.0);
  EXPECT_LT(*h, std::log(64.0));
  EXPECT_LE(*h, std::log(4.0));  // at most 4 successors per state
  const std::vector<int64_t> tokens = CoveredTokens(**ds);
  const double empirical = EmpiricalEntropy(tokens);
  std::cout << "entropy " << *h << " nats, empirical " << empirical << "\n";
  EXPECT_NEAR(empirical, *h, 0.01);

  // Every state has exactly `branching` distinct successors, one of them (s + 1) mod vocab.
  std::map<int64_t, std::set<int64_t>> successors;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) successors[tokens[i]].insert(tokens[i + 1]);
  ASSERT_EQ(successors.size(), 64u);
  for (const auto& [s, next] : successors) {
    EXPECT_EQ(next.size(), 4u) << "state " << s;
    EXPECT_EQ(next.count((s + 1) % 64), 1u) << "state " << s;
  }
}

TEST(SyntheticCorpusTest, EntropyMatchesForOtherShapes) {
  struct Case {
    int64_t vocab;
    int64_t branching;
  };
  // Sparse and dense successor sets (the latter takes the Fisher-Yates path).
  for (const Case& c : {Case{16, 3}, Case{8, 8}, Case{200, 2}}) {
    SyntheticCorpusOptions opts;
    opts.vocab = c.vocab;
    opts.branching = c.branching;
    opts.seed = 7;
    auto ds = MakeSyntheticCorpus(opts);
    ASSERT_TRUE(ds.ok()) << ds.status();
    const double h = *(*ds)->entropy_nats();
    EXPECT_GT(h, 0.0);
    EXPECT_LE(h, std::log(static_cast<double>(c.branching)) + 1e-12);
    EXPECT_NEAR(EmpiricalEntropy(CoveredTokens(**ds)), h, 0.01)
        << "vocab " << c.vocab << " branching " << c.branching;
  }
}

TEST(SyntheticCorpusTest, DeterministicCycleHasZeroEntropy) {
  // Branching 1 is the periodic cycle s -> s+1; the stationary distribution still exists.
  SyntheticCorpusOptions opts;
  opts.vocab = 10;
  opts.branching = 1;
  opts.num_tokens = 1000;
  opts.window.seq_len = 4;
  auto ds = MakeSyntheticCorpus(opts);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_NEAR(*(*ds)->entropy_nats(), 0.0, 1e-15);
  const std::vector<int64_t> tokens = CoveredTokens(**ds);
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    ASSERT_EQ(tokens[i + 1], (tokens[i] + 1) % 10);
  }
}

TEST(SyntheticCorpusTest, RejectsBadOptions) {
  auto with = [](auto edit) {
    SyntheticCorpusOptions opts;
    opts.num_tokens = 1000;
    edit(opts);
    return MakeSyntheticCorpus(opts).status().code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(with([](auto& o) { o.vocab = 1; }), kInvalid);
  EXPECT_EQ(with([](auto& o) { o.branching = 0; }), kInvalid);
  EXPECT_EQ(with([](auto& o) { o.branching = 65; }), kInvalid);
  EXPECT_EQ(with([](auto& o) { o.window.seq_len = 0; }), kInvalid);
  EXPECT_EQ(with([](auto& o) { o.num_tokens = 32; }), kInvalid);
  EXPECT_EQ(with([](auto& o) { o.num_tokens = 33; }), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace pipetrain::data

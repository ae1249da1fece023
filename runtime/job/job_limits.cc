#include "runtime/job/job_limits.h"

#include <cmath>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/reflection.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "runtime/base/printable.h"
#include "runtime/job/job_spec.h"

namespace pipetrain::job {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr double kU64Max = 18446744073709551615.0;

// 65536 -> "65,536"; 2^64 - 1 -> "2^64 - 1".
std::string FormatBound(double v) {
  if (v >= kU64Max) return "2^64 - 1";
  if (v != std::floor(v)) return absl::StrFormat("%.10g", v);
  std::string digits = absl::StrFormat("%.0f", std::fabs(v));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(i, ",");
  return (v < 0 ? "-" : "") + digits;
}

// A field's value as a violation shows it: an integer field's digits, a floating one's
// shortest round-trip form (JSON's).
std::string FormatValue(const FieldDescriptor* f, double x) {
  if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE ||
      f->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
    return nlohmann::json(x).dump();
  }
  return absl::StrFormat("%.0f", x);
}

// The violation of `limit` by the number `x`, or "".
std::string Check(const FieldLimit& limit, const std::string& where, const FieldDescriptor* f,
                  double x) {
  if (!std::isfinite(x)) return absl::StrCat(where, ": must be a finite number, got ", x);
  if (x < limit.min || x > limit.max) {
    return absl::StrCat(where, ": must be in [", FormatBound(limit.min), ", ",
                        FormatBound(limit.max), "] (", limit.reason, "), got ", FormatValue(f, x));
  }
  return "";
}

// Printable UTF-8: nothing Printable() would escape.
bool IsPrintableUtf8(const std::string& s) { return Printable(s) == s; }

// Each field of `d` with a `limit` option, its messages' fields after it, "prefix.name".
void CollectLimits(const google::protobuf::Descriptor* d, const std::string& prefix,
                   std::vector<FieldLimit>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      CollectLimits(f->message_type(), path, out);
    } else if (f->options().HasExtension(v1::limit)) {
      const v1::FieldLimit& l = f->options().GetExtension(v1::limit);
      out->push_back({path, l.min(), l.max(), l.reason()});
    }
  }
}

// The number at `path` of `msg` (its `index`th item if repeated), as a double.
double NumberAt(const Message& msg, const FieldDescriptor* f, int index) {
  const Reflection* r = msg.GetReflection();
  const bool rep = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(msg, f, index) : r->GetInt32(msg, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return static_cast<double>(rep ? r->GetRepeatedInt64(msg, f, index) : r->GetInt64(msg, f));
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(msg, f, index) : r->GetUInt32(msg, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return static_cast<double>(rep ? r->GetRepeatedUInt64(msg, f, index) : r->GetUInt64(msg, f));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return rep ? r->GetRepeatedDouble(msg, f, index) : r->GetDouble(msg, f);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return rep ? r->GetRepeatedFloat(msg, f, index) : r->GetFloat(msg, f);
    default: return 0;  // no `limit` on anything but numbers
  }
}

}  // namespace

const std::vector<FieldLimit>& JobFieldLimits() {
  static const std::vector<FieldLimit> limits = [] {
    std::vector<FieldLimit> out;
    CollectLimits(JobSpec::descriptor(), "", &out);
    return out;
  }();
  return limits;
}

std::vector<std::string> LimitViolations(const JobSpec& spec, int stages) {
  std::vector<std::string> errors;
  for (const FieldLimit& limit : JobFieldLimits()) {
    const Message* msg = &spec;
    const FieldDescriptor* f = nullptr;
    for (absl::string_view name : absl::StrSplit(limit.path, '.')) {
      if (f != nullptr) msg = &msg->GetReflection()->GetMessage(*msg, f);
      f = msg->GetDescriptor()->FindFieldByName(std::string(name));
    }
    if (f->is_repeated()) {
      for (int i = 0; i < msg->GetReflection()->FieldSize(*msg, f); ++i) {
        std::string e =
            Check(limit, absl::StrCat(limit.path, "[", i, "]"), f, NumberAt(*msg, f, i));
        if (!e.empty()) errors.push_back(std::move(e));
      }
    } else if (std::string e = Check(limit, limit.path, f, NumberAt(*msg, f, 0)); !e.empty()) {
      errors.push_back(std::move(e));
    }
  }
  if (static_cast<double>(stages) * spec.replicas() > kMaxRanks) {
    errors.push_back(absl::StrCat("replicas: stages x replicas must be at most ",
                                  FormatBound(kMaxRanks),
                                  " (a rank each, all listed in the "
                                  "job's status), got ",
                                  int64_t{stages} * spec.replicas()));
  }
  if (spec.name().size() > kMaxNameBytes || !IsPrintableUtf8(spec.name())) {
    errors.push_back(absl::StrCat("name: must be at most ", kMaxNameBytes,
                                  " bytes of printable UTF-8, got ", spec.name().size(), " bytes",
                                  IsPrintableUtf8(spec.name()) ? ""
                                                               : " with control "
                                                                 "characters or invalid UTF-8"));
  }
  for (const auto& [path, value] :
       {std::pair<const char*, const std::string*>{"model.path", &spec.model().path()},
        {"data.path", &spec.data().path()},
        {"weights_dir", &spec.weights_dir()},
        {"checkpoint.dir", &spec.checkpoint().dir()},
        {"resume_from", &spec.resume_from()}}) {
    if (value->size() > kMaxPathBytes || !IsPrintableUtf8(*value)) {
      errors.push_back(absl::StrCat(path, ": must be a path of at most ", kMaxPathBytes,
                                    " bytes without control characters"));
    }
  }
  return errors;
}

std::string LimitsMarkdown() {
  std::string md = "| field | min | max | why |\n|---|---|---|---|\n";
  for (const FieldLimit& l : JobFieldLimits()) {
    absl::StrAppend(&md, "| `", l.path, "` | ", FormatBound(l.min), " | ", FormatBound(l.max),
                    " | ", l.reason, " |\n");
  }
  absl::StrAppend(&md, "\nAlso: every number finite; `stages` x `replicas` at most ",
                  FormatBound(kMaxRanks),
                  " (a rank each, all listed in the job's status); "
                  "`name` at most ",
                  kMaxNameBytes,
                  " bytes of printable UTF-8; `model.path`, `data.path`, `weights_dir`, "
                  "`checkpoint.dir` and `resume_from` at most ",
                  kMaxPathBytes, " bytes without control characters.\n");
  return md;
}

}  // namespace pipetrain::job

#include "jobspec/spec_yaml.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/reflection.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pipetrain::jobspec {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// "model.d_model (line 3)" where the node came from a file, else the path alone.
std::string At(const std::string& path, const YAML::Node& node) {
  const YAML::Mark mark = node.Mark();
  return mark.line >= 0 ? absl::StrCat(path, " (line ", mark.line + 1, ")") : path;
}

class Reader {
 public:
  explicit Reader(std::vector<std::string>* errors) : errors_(errors) {}

  void ReadMessage(const YAML::Node& node, const std::string& path, Message* msg) {
    if (!node.IsMap()) {
      errors_->push_back(absl::StrCat(path.empty() ? "job" : path, ": expected a mapping"));
      return;
    }
    const auto* desc = msg->GetDescriptor();
    std::set<std::string> seen;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) {
        errors_->push_back(absl::StrCat(At(path.empty() ? "job" : path, kv.first),
                                        ": a key must be a plain name, not a list or mapping"));
        continue;
      }
      const std::string key = kv.first.Scalar();
      const std::string field_path = path.empty() ? key : absl::StrCat(path, ".", key);
      if (!seen.insert(key).second) {
        errors_->push_back(absl::StrCat(At(field_path, kv.first), ": duplicate key"));
        continue;
      }
      if (path.empty() && key == "stages") {
        ReadStages(kv.second, static_cast<v1::JobSpec*>(msg));
        continue;
      }
      const FieldDescriptor* f = desc->FindFieldByName(key);
      if (f == nullptr || (path.empty() && key == "stage_ranges")) {
        std::vector<std::string> known;
        for (int i = 0; i < desc->field_count(); ++i) {
          if (!(path.empty() && desc->field(i)->name() == "stage_ranges")) {
            known.push_back(desc->field(i)->name());
          }
        }
        errors_->push_back(
            absl::StrCat(field_path, ": unknown key (known: ", absl::StrJoin(known, ", "), ")"));
        continue;
      }
      ReadField(kv.second, field_path, msg, f);
    }
  }

  void ReadField(const YAML::Node& node, const std::string& path, Message* msg,
                 const FieldDescriptor* f) {
    const auto* r = msg->GetReflection();
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        errors_->push_back(absl::StrCat(path, ": not settable from YAML"));
        return;
      }
      ReadMessage(node, path, r->MutableMessage(msg, f));
      return;
    }
    if (f->is_repeated()) {
      if (!node.IsSequence()) {
        errors_->push_back(absl::StrCat(path, ": expected a list"));
        return;
      }
      for (size_t i = 0; i < node.size(); ++i) {
        const std::string item = absl::StrCat(path, "[", i, "]");
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
          std::string v;
          if (ScalarAs(node[i], item, "a string", &v)) r->AddString(msg, f, v);
          continue;
        }
        int64_t v = 0;
        if (f->cpp_type() != FieldDescriptor::CPPTYPE_INT64 ||
            !ScalarAs(node[i], item, "an integer", &v)) {
          continue;
        }
        r->AddInt64(msg, f, v);
      }
      return;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING: {
        std::string v;
        if (ScalarAs(node, path, "a string", &v)) r->SetString(msg, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT32: {
        int64_t v;
        if (ScalarAs(node, path, "an integer", &v)) {
          if (v < INT32_MIN || v > INT32_MAX) {
            errors_->push_back(absl::StrCat(path, ": ", v, " is out of range"));
          } else {
            r->SetInt32(msg, f, static_cast<int32_t>(v));
          }
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t v;
        if (ScalarAs(node, path, "an integer", &v)) r->SetInt64(msg, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t v;
        if (ScalarAs(node, path, "a non-negative integer", &v)) r->SetUInt64(msg, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        double v;
        if (!ScalarAs(node, path, "a number", &v)) break;
        if (!std::isfinite(v)) {
          errors_->push_back(absl::StrCat(At(path, node), ": expected a finite number, got '",
                                          node.Scalar(), "'"));
          break;
        }
        r->SetDouble(msg, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        bool v;
        if (ScalarAs(node, path, "true or false", &v)) r->SetBool(msg, f, v);
        break;
      }
      default: errors_->push_back(absl::StrCat(path, ": not settable from YAML"));
    }
  }

  void ReadStages(const YAML::Node& node, v1::JobSpec* spec);

 private:
  template <typename T>
  bool ScalarAs(const YAML::Node& node, const std::string& path, const char* what, T* out) {
    if (node.IsScalar()) {
      try {
        *out = node.as<T>();
        return true;
      } catch (const YAML::Exception&) {
      }
    }
    errors_->push_back(absl::StrCat(path, ": expected ", what, ", got '",
                                    node.IsScalar() ? node.Scalar() : "a non-scalar", "'"));
    return false;
  }

  std::vector<std::string>* errors_;
};

void Reader::ReadStages(const YAML::Node& node, v1::JobSpec* spec) {
  if (node.IsScalar()) {
    if (node.Scalar() == "auto") {
      spec->set_auto_stages(true);
      return;
    }
    int count = 0;
    if (absl::SimpleAtoi(node.Scalar(), &count)) {
      spec->set_stages(count);
      return;
    }
    for (absl::string_view part : absl::StrSplit(node.Scalar(), ',')) {
      std::vector<std::string> ends = absl::StrSplit(part, ':');
      int b = 0, e = 0;
      if (ends.size() != 2 || !absl::SimpleAtoi(ends[0], &b) || !absl::SimpleAtoi(ends[1], &e)) {
        errors_->push_back(
            absl::StrCat("stages: expected a count, auto, \"0:2,2:7\" or [[0, 2], [2, 7]], got '",
                         node.Scalar(), "'"));
        spec->clear_stage_ranges();
        return;
      }
      auto* r = spec->add_stage_ranges();
      r->set_begin(b);
      r->set_end(e);
    }
    return;
  }
  if (node.IsSequence()) {
    for (size_t i = 0; i < node.size(); ++i) {
      int b = 0, e = 0;
      if (!node[i].IsSequence() || node[i].size() != 2 ||
          !ScalarAs(node[i][0], absl::StrCat("stages[", i, "][0]"), "an integer", &b) ||
          !ScalarAs(node[i][1], absl::StrCat("stages[", i, "][1]"), "an integer", &e)) {
        if (!node[i].IsSequence() || node[i].size() != 2) {
          errors_->push_back(absl::StrCat("stages[", i, "]: expected [begin, end]"));
        }
        continue;
      }
      auto* r = spec->add_stage_ranges();
      r->set_begin(b);
      r->set_end(e);
    }
    return;
  }
  errors_->push_back("stages: expected a count, \"0:2,2:7\" or [[0, 2], [2, 7]]");
}

}  // namespace

absl::StatusOr<v1::JobSpec> JobSpecFromYaml(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("invalid job: not YAML: ", e.what()));
  }
  v1::JobSpec spec;
  if (!root || root.IsNull()) {
    return absl::InvalidArgumentError(
        "invalid job: the job file is empty (a job file with only defaults is `{}`)");
  }
  std::vector<std::string> errors;
  try {
    Reader(&errors).ReadMessage(root, "", &spec);
  } catch (const YAML::Exception& e) {  // a node of a shape no check above foresaw
    errors.push_back(e.what());
  }
  if (!errors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid job: ", absl::StrJoin(errors, "; ")));
  }
  return spec;
}

void SetSpecField(const std::string& path, const std::string& text, v1::JobSpec* spec,
                  std::vector<std::string>* errors) {
  Reader reader(errors);
  if (path == "stages") {  // a count or ranges, replacing either
    spec->clear_stages();
    spec->clear_stage_ranges();
    spec->clear_auto_stages();
    reader.ReadStages(YAML::Node(text), spec);
    return;
  }
  const std::vector<std::string> parts = absl::StrSplit(path, '.');
  Message* msg = spec;
  const FieldDescriptor* f = nullptr;
  for (size_t i = 0; i < parts.size(); ++i) {
    f = msg->GetDescriptor()->FindFieldByName(parts[i]);
    if (f == nullptr || i + 1 == parts.size()) break;
    if (f->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || f->is_repeated()) {
      f = nullptr;
      break;
    }
    msg = msg->GetReflection()->MutableMessage(msg, f);
  }
  if (f == nullptr || f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
    errors->push_back(absl::StrCat(path, ": not a settable field of the job spec"));
    return;
  }
  if (f->is_repeated()) {  // "a,b,c"
    msg->GetReflection()->ClearField(msg, f);
    YAML::Node list(YAML::NodeType::Sequence);
    for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
      list.push_back(std::string(absl::StripAsciiWhitespace(item)));
    }
    reader.ReadField(list, path, msg, f);
    return;
  }
  reader.ReadField(YAML::Node(text), path, msg, f);
}

absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return JobSpecFromYaml(text.str());
}

}  // namespace pipetrain::jobspec

#include "jobspec/spec_text.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"

namespace pipetrain::jobspec {

std::string JobSpecToText(const v1::JobSpec& spec) {
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  std::string text;
  printer.PrintToString(spec, &text);
  return text;
}

namespace {

// Keeps the parser's first error for the status instead of logging it.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (error.empty()) error = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  std::string error;
};

}  // namespace

absl::StatusOr<v1::JobSpec> JobSpecFromText(const std::string& text) {
  v1::JobSpec spec;
  FirstError errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a pipetrain.v1.JobSpec in text format: ", errors.error));
  }
  return spec;
}

}  // namespace pipetrain::jobspec

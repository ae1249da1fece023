// The command-line flags of a job: one table mapping each flag onto one field of
// pipetrain.v1.JobSpec, shared by `pipetrain run` (every launch mode), `pipetrain submit` and
// pipetrain-run. A flag's value is read as the YAML reader reads that key (spec_yaml.h), so a
// value means the same in a job file and on the command line; flags given override the file.
// Every field of the spec has a flag (tests/jobspec walks the spec to check it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::jobspec {

struct SpecFlag {
  const char* name;   // "--d-model"
  const char* path;   // the field, as its YAML key path: "model.d_model"
  const char* group;  // the heading it is listed under in --help
  const char* help;
  // Shown as the default in --help; nullptr: the runtime's default for the field.
  const char* default_text = nullptr;
  // A field this flag also sets, and to what ("model.name" = "torchscript" for
  // --torchscript); nullptr if none.
  const char* also_path = nullptr;
  const char* also_value = nullptr;
};

// The table, in --help order.
const std::vector<SpecFlag>& SpecFlagTable();

// Every flag of the table bound to a CLI11 app, each showing its default.
class SpecFlags {
 public:
  explicit SpecFlags(CLI::App* app);

  // Sets the field of every flag given on the command line; InvalidArgument listing every
  // bad value ("--steps (steps): expected an integer, got 'x'").
  absl::Status ApplyTo(v1::JobSpec* spec) const;

 private:
  struct Bound {
    const SpecFlag* flag;
    CLI::Option* option;
    std::shared_ptr<std::string> value;
  };
  std::vector<Bound> bound_;
};

// The job a command line describes: the YAML file `job_file` (none if empty) with the flags
// given applied over it. NotFound if the file cannot be read; InvalidArgument with every
// problem otherwise. Semantic checks are job::ValidateJob's.
absl::StatusOr<v1::JobSpec> BuildJobSpec(const std::string& job_file, const SpecFlags& flags);

}  // namespace pipetrain::jobspec

// Protobuf logs one line for every request whose string field is not UTF-8 (it then fails
// the parse, and gRPC answers the call with an error). A careless or hostile client could
// fill a daemon's log that way: QuietMalformedRequestLogs keeps those lines to one every 10
// seconds, with the count of the ones left out; other protobuf logs pass as they are.
#pragma once

namespace pipetrain::rpc {

// Installs the log handler for the whole process (call once, early in main).
void QuietMalformedRequestLogs();

}  // namespace pipetrain::rpc

// The file-system steps that make a save durable, shared by every writer (safetensors files,
// optim/checkpoint.h, parallel/resilience/checkpoint_manager.h, benchmark JSON):
//
//   write_file_atomically   temp file beside the target, write, fsync, rename over the target,
//                           fsync the directory: a crash leaves the old file or the new one,
//                           never a torn one
//   make_directory          mkdir that accepts an existing directory
//   fsync_directory         makes the renames and creations inside `dir` durable
#pragma once

#include <string>

namespace mg {

// Writes `bytes` to `path` atomically (temp file in the same directory, fsync, rename, fsync dir).
void write_file_atomically(const std::string& path, const std::string& bytes);

// Creates `dir` (mode 0755) unless it exists; an error names `who` (the caller) and the reason.
void make_directory(const std::string& dir, const std::string& who);

// fsyncs the directory entry itself, so renames and creations inside it survive a crash.
// Best effort: a directory that cannot be opened is left alone.
void fsync_directory(const std::string& dir);

// strerror(errno), for the reason in an error message.
std::string errno_text();

}  // namespace mg

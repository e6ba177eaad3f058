#include "core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace mg {

std::string errno_text() { return std::strerror(errno); }

namespace {

void write_all(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    MG_CHECK(written > 0, "writing ", path, " failed: ", errno_text());
    data += written;
    size -= static_cast<size_t>(written);
  }
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  MG_CHECK(fd >= 0, "cannot create ", temp, ": ", errno_text());
  try {
    write_all(fd, bytes.data(), bytes.size(), temp);
    MG_CHECK(::fsync(fd) == 0, "fsync of ", temp, " failed: ", errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  MG_CHECK(::close(fd) == 0, "closing ", temp, " failed: ", errno_text());
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    ::unlink(temp.c_str());
    throw Error(str_cat("cannot rename ", temp, " to ", path, ": ", reason));
  }
  // Make the rename itself durable: fsync the directory entry.
  const size_t slash = path.find_last_of('/');
  fsync_directory(slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash)));
}

void make_directory(const std::string& dir, const std::string& who) {
  if (::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) return;
  throw Error(str_cat(who, ": cannot create directory ", dir, ": ", errno_text()));
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace mg

// link_probe: the throughput of one TCP stream between two cluster nodes, for the check that
// `scripts/cluster --link RATE` shapes links to RATE (check_link_shaping.sh). The machines the
// tests run on have no iperf or netcat, and bash cannot listen on a socket, hence this probe.
//
//   link_probe recv PORT              accept one connection, read to EOF, print the rate
//   link_probe send HOST PORT BYTES   connect (retrying while the receiver starts), send BYTES
//
// The receiver prints "received B bytes, R Mbit/s": R is the payload rate after the first MiB,
// so neither TCP's slow start nor the token bucket's initial burst (the bytes a tbf lets through
// at once) inflate it.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
constexpr long long kSkipBytes = 1 << 20;

int fail(const char* what) {
  std::fprintf(stderr, "link_probe: %s: %s\n", what, std::strerror(errno));
  return 1;
}

int receive(int port) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return fail("socket");
  int yes = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return fail("bind");
  if (listen(listener, 1) != 0) return fail("listen");
  int connection = accept(listener, nullptr, nullptr);
  if (connection < 0) return fail("accept");
  std::vector<char> buffer(1 << 16);
  long long total = 0;
  Clock::time_point after_skip;
  for (;;) {
    ssize_t n = read(connection, buffer.data(), buffer.size());
    if (n < 0) return fail("read");
    if (n == 0) break;
    const bool crossed = total < kSkipBytes && total + n >= kSkipBytes;
    total += n;
    if (crossed) after_skip = Clock::now();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - after_skip).count();
  close(connection);
  close(listener);
  if (total <= kSkipBytes) {
    std::fprintf(stderr, "link_probe: only %lld bytes received, need more than %lld\n", total, kSkipBytes);
    return 1;
  }
  std::printf("received %lld bytes, %.1f Mbit/s\n", total, (total - kSkipBytes) * 8.0 / seconds / 1e6);
  return 0;
}

int send_bytes(const char* host, const char* port, long long bytes) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host, port, &hints, &found) != 0 || found == nullptr) {
    std::fprintf(stderr, "link_probe: cannot resolve %s\n", host);
    return 1;
  }
  int sock = -1;
  for (int attempt = 0; attempt < 100 && sock < 0; ++attempt) {  // the receiver may still be starting
    sock = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(sock, found->ai_addr, found->ai_addrlen) != 0) {
      close(sock);
      sock = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  freeaddrinfo(found);
  if (sock < 0) return fail("connect");
  std::vector<char> buffer(1 << 16, 'x');
  for (long long left = bytes; left > 0;) {
    ssize_t n = write(sock, buffer.data(), static_cast<size_t>(std::min<long long>(left, buffer.size())));
    if (n < 0) return fail("write");
    left -= n;
  }
  shutdown(sock, SHUT_WR);
  char drain;
  while (read(sock, &drain, 1) > 0) {
  }
  close(sock);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "recv" && argc == 3) return receive(std::atoi(argv[2]));
  if (mode == "send" && argc == 5) return send_bytes(argv[2], argv[3], std::atoll(argv[4]));
  std::fprintf(stderr, "usage: link_probe recv PORT | link_probe send HOST PORT BYTES\n");
  return 2;
}

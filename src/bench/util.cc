// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "bench/util.h"

#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

namespace dedup::bench {

namespace {
std::atomic<bool> g_stop{false};
// From block 10 (keys >= 10^9): redis-benchmark -r 1000000000 writes
// task_id:<0 .. 10^9-1> on the same server, and a claim of one of its keys meets a
// foreign record (a failed call in the table).
std::atomic<uint64_t> g_key_block{10};
}  // namespace

OpenOptions QuietOpen() {
  OpenOptions o;
  o.on_warning = [](const std::string&) {};
  return o;
}

void RequestStop() { g_stop.store(true); }
bool StopRequested() { return g_stop.load(std::memory_order_relaxed); }

double Seconds(Clk::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

size_t TaskKeyInto(uint64_t n, char* buf) {
  // "task_id:" + 12 digits, zero-padded.
  static constexpr char kPrefix[] = "task_id:";
  std::copy(kPrefix, kPrefix + 8, buf);
  n %= 1'000'000'000'000ULL;
  for (int i = 19; i >= 8; --i) {
    buf[i] = static_cast<char>('0' + n % 10);
    n /= 10;
  }
  buf[20] = '\0';
  return 20;
}

std::string TaskKey(uint64_t n) {
  char buf[32];
  return std::string(buf, TaskKeyInto(n, buf));
}

uint64_t NextKeyBlock() { return g_key_block.fetch_add(1) * 100'000'000ULL; }

json Num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

std::string Fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string Rate(double v) {
  if (!std::isfinite(v)) return "-";
  // Built forwards, not by insert() (which GCC 12 warns about, -Wrestrict, wrongly).
  const std::string digits = std::to_string(static_cast<long long>(std::llround(v)));
  std::string s;
  s.reserve(digits.size() + digits.size() / 3);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ' ';
    s += digits[i];
  }
  return s;
}

namespace {
// Whether a thread of this process other than `self` is R or D.
bool OtherThreadBusy(long self) {
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return false;
  bool busy = false;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.' || std::strtol(e->d_name, nullptr, 10) == self) continue;
    char path[sizeof "/proc/self/task//stat" + sizeof e->d_name], buf[512];
    std::snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) continue;  // ended meanwhile
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    // "tid (name) S ...": the name may hold spaces and parentheses.
    const char* close = std::strrchr(buf, ')');
    if (close != nullptr && close[1] == ' ' && (close[2] == 'R' || close[2] == 'D')) {
      busy = true;
      break;
    }
  }
  closedir(d);
  return busy;
}
}  // namespace

double AwaitQuiet(double max_s) {
  const long self = static_cast<long>(syscall(SYS_gettid));
  const auto start = Clk::now();
  for (int quiet = 0; quiet < 3 && Seconds(Clk::now() - start) < max_s;) {
    quiet = OtherThreadBusy(self) ? 0 : quiet + 1;
    if (quiet < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Seconds(Clk::now() - start);
}

long RssBytes() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, rss = 0;
  f >> pages >> rss;
  return rss * sysconf(_SC_PAGESIZE);
}

uint64_t DirBytes(const std::string& dir, const std::string& suffix) {
  uint64_t total = 0;
  std::error_code ec;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    if (!suffix.empty() && e.path().extension() != suffix) continue;
    total += e.file_size(ec);
  }
  return total;
}

std::string MakeTempDir(const std::string& tag) {
  std::string t = (std::filesystem::temp_directory_path() / ("dedup-bench-" + tag + "-XXXXXX")).string();
  if (mkdtemp(t.data()) == nullptr) return "";
  return t;
}

double Hist::QuantileUs(double q) const {
  if (n == 0) return NAN;
  const uint64_t want = static_cast<uint64_t>(std::ceil(q * static_cast<double>(n)));
  uint64_t seen = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    seen += b[i];
    if (seen >= want && b[i] > 0) {
      const double e = static_cast<double>(i / 16), sub = static_cast<double>(i % 16);
      return (16.0 + sub + 0.5) * std::pow(2.0, e) / 16.0 / 1000.0;
    }
  }
  return NAN;
}

double Hist::MaxUs() const {
  for (size_t i = b.size(); i-- > 0;) {
    if (b[i] == 0) continue;
    const double e = static_cast<double>(i / 16), sub = static_cast<double>(i % 16);
    return (16.0 + sub + 1.0) * std::pow(2.0, e) / 16.0 / 1000.0;
  }
  return NAN;
}

}  // namespace dedup::bench

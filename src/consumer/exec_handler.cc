// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "consumer/exec_handler.h"

#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string_view>
#include <utility>

#include "core/printable.h"

namespace dedup {
namespace {

std::vector<std::string> SplitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// True when `word` is a redirection ("2>&1", ">>log", "<", "&>x"); *needs_target
// when its target is the next word (">" alone).
bool IsRedirection(const std::string& word, bool* needs_target) {
  size_t i = 0;
  while (i < word.size() && word[i] >= '0' && word[i] <= '9') ++i;
  if (i < word.size() && word[i] == '&' && i == 0) ++i;  // &> and &>>
  const size_t op = i;
  while (i < word.size() && (word[i] == '<' || word[i] == '>')) ++i;
  if (i == op) return false;
  if (i < word.size() && (word[i] == '&' || word[i] == '|' || word[i] == '-')) ++i;
  *needs_target = i == word.size();
  return true;
}

// The index of the first word the shell would run as a command, past
// redirections (and their targets) and separators; words.size() when there is
// none, or a comment comes first.
size_t CommandWord(const std::vector<std::string>& words) {
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w[0] == '#') return words.size();  // the rest is a comment
    if (w == "&" || w == ";" || w == "&&" || w == "||") continue;
    bool needs_target = false;
    if (!IsRedirection(w, &needs_target)) return i;
    if (needs_target) ++i;
  }
  return words.size();
}

// A shell command that runs nothing, only redirections, separators or a comment:
// `"$HANDLER >>log 2>&1"` with HANDLER unset exits 0 for every message, each one
// recorded done and acked with nothing run (exec17), as an empty one would.
bool RunsNothing(const std::vector<std::string>& words) {
  return CommandWord(words) == words.size();
}

// The variable a command word names when the word is nothing but its expansion
// (`$NAME`, `${NAME}`, either in double quotes), else empty.
std::string PlainVariable(std::string_view w) {
  if (w.size() >= 2 && w.front() == '"' && w.back() == '"') w = w.substr(1, w.size() - 2);
  if (w.size() < 2 || w[0] != '$') return {};
  w.remove_prefix(1);
  if (w.front() == '{') {
    if (w.back() != '}') return {};
    w = w.substr(1, w.size() - 2);
  }
  if (w.empty() || (w[0] >= '0' && w[0] <= '9')) return {};
  for (char c : w) {
    if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) {
      return {};
    }
  }
  return std::string(w);
}

// `--exec '$HANDLER --verbose'` with HANDLER unset or empty where the worker
// starts (the handler inherits that environment): the shell runs `--verbose` as
// the command, failing every message, or, with nothing after it, runs nothing
// and exits 0, recording every message done. Refused at start, naming it. The
// variables set per message, and those the shell sets itself, are left alone.
Status CheckFirstWordIsSet(const std::vector<std::string>& words) {
  const size_t i = CommandWord(words);
  if (i == words.size()) return Status::Ok();
  const std::string name = PlainVariable(words[i]);
  static const char* const kSetForTheCommand[] = {
      "DEDUP_KEY", "DEDUP_FENCE", "DEDUP_ATTEMPT", "DEDUP_ENTRY_ID", "DEDUP_WORKER_PID",
      "PPID",      "PWD",         "IFS",           "OPTIND",         "PS1", "PS2", "PS4"};
  if (name.empty()) return Status::Ok();
  for (const char* set : kSetForTheCommand) {
    if (name == set) return Status::Ok();
  }
  const char* value = std::getenv(name.c_str());
  if (value != nullptr && *value != '\0') return Status::Ok();
  return Status::InvalidArgument(
      "the command's first word, " + internal::Printable(words[i]) + ", is " +
      (value == nullptr ? "unset" : "empty") +
      " in the environment the command runs in: the shell would run " +
      (i + 1 < words.size() ? "the next word as the command (failing every message)"
                            : "nothing and record every message as done") +
      "; set " + name + " or name the program");
}

// `/bin/sh -n -c command`: the shell's own syntax check, run once at start, so
// that a command it cannot parse is refused instead of failing (exit 2) for
// every message, each one recorded failed and dead-lettered. The shell's words
// on stderr, when it gives any.
Status CheckShellSyntax(const std::string& command) {
  int err[2];
  if (pipe2(err, O_CLOEXEC) != 0) return Status::Ok();  // not checked: the runs will say
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  const char* argv[] = {"/bin/sh", "-n", "-c", command.c_str(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/bin/sh", &fa, nullptr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(err[1]);
  if (rc != 0) {
    close(err[0]);
    return Status::Ok();  // no shell to ask: the runs will say
  }
  std::string said;
  char buf[512];
  for (ssize_t r; (r = read(err[0], buf, sizeof(buf))) != 0;) {
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (said.size() < 4096) said.append(buf, static_cast<size_t>(r));
  }
  close(err[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  while (!said.empty() && (said.back() == '\n' || said.back() == '\r')) said.pop_back();
  return Status::InvalidArgument("the shell cannot parse the command" +
                                 (said.empty() ? std::string() : ": " + internal::Printable(said)) +
                                 " (it would fail for every message)");
}

}  // namespace

StatusOr<std::vector<std::string>> ExecHandler::Argv(const ExecHandlerOptions& options) {
  // `/bin/sh -c ''` exits 0: every message would be recorded done and acked
  // with nothing run (an unset "$HANDLER" in a unit file does it).
  if (options.command.find_first_not_of(" \t\n\v\f\r") == std::string::npos) {
    return Status::InvalidArgument(
        "empty command (it would run nothing and record every message as done)");
  }
  std::vector<std::string> words = SplitWords(options.command);
  if (options.shell) {
    if (RunsNothing(words)) {
      return Status::InvalidArgument(
          "the command runs nothing, only redirections or a comment (an unset variable in "
          "front of them?); it would record every message as done");
    }
    DEDUP_RETURN_IF_ERROR(CheckFirstWordIsSet(words));
    DEDUP_RETURN_IF_ERROR(CheckShellSyntax(options.command));
    // `--exec ./charge.sh` with the script missing or not executable: the shell
    // exits 127 / 126 for every message, each one retried for ever. When the
    // first word is a plain path (a '/', nothing the shell would expand or
    // parse), its program is checked here, once; anything else is the shell's.
    const std::string& first = words[0];
    if (first.find('/') != std::string::npos &&
        first.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                "0123456789_./+-,:@%") == std::string::npos) {
      StatusOr<std::string> found = ResolveCommand(first);
      if (!found.ok()) return found.status();
    }
    return std::vector<std::string>{"/bin/sh", "-c", options.command};
  }
  // Refused here, once, rather than as a retry of every delivery.
  StatusOr<std::string> found = ResolveCommand(words[0]);
  if (!found.ok()) return found.status();
  return words;
}

StatusOr<std::unique_ptr<ExecHandler>> ExecHandler::Make(HandlerSupervisor* supervisor,
                                                         ExecHandlerOptions options,
                                                         std::vector<std::string> argv) {
  if (supervisor == nullptr) return Status::InvalidArgument("exec handler: no supervisor");
  if (argv.empty()) return Status::InvalidArgument("exec handler: empty argv (see Argv())");
  return std::unique_ptr<ExecHandler>(
      new ExecHandler(supervisor, std::move(options), std::move(argv)));
}

ExecHandler::ExecHandler(HandlerSupervisor* supervisor, ExecHandlerOptions options,
                         std::vector<std::string> argv)
    : supervisor_(supervisor), options_(std::move(options)), argv_(std::move(argv)),
      worker_pid_env_("DEDUP_WORKER_PID=" + std::to_string(getpid())) {}

HandlerResult ExecHandler::Run(const Delivery& d, uint64_t fence, uint32_t attempt,
                               const ClaimGuard* claim, bool keep_output) const {
  if (!options_.observe) return RunCommand(d, fence, attempt, claim, keep_output);
  const auto t0 = std::chrono::steady_clock::now();
  HandlerResult r = RunCommand(d, fence, attempt, claim, keep_output);
  options_.observe(std::chrono::steady_clock::now() - t0, r);
  return r;
}

HandlerResult ExecHandler::RunCommand(const Delivery& d, uint64_t fence, uint32_t attempt,
                                      const ClaimGuard* claim, bool keep_output) const {
  // An environment variable ends at its first NUL: DEDUP_KEY would be cut, and the
  // handler would act on another key's name. Refused (dead-lettered), never run.
  if (d.key().find('\0') != std::string::npos) {
    return HandlerResult::Fail("key contains a NUL byte, which DEDUP_KEY cannot carry; "
                               "handler not run");
  }
  HandlerCommand c;
  c.argv = argv_;
  if (options_.stdin_format == ExecHandlerOptions::Stdin::kAttributesJson) {
    // The JSON object must say what the entry holds, or the handler acts on
    // something else than what was claimed: a field given twice kept only its
    // last value (the key was made from the first), and bytes that are not
    // UTF-8 became U+FFFD. Such an entry is refused (dead-lettered), never run.
    nlohmann::json payload = nlohmann::json::object();
    for (const auto& [k, v] : d.attributes()) {
      if (!internal::IsValidUtf8(k) || !internal::IsValidUtf8(v)) {
        return HandlerResult::Fail("field '" + internal::PrintableCut(k, 64) +
                                   "' holds bytes that are not UTF-8, which the JSON on the "
                                   "handler's stdin cannot carry as they are; handler not run");
      }
      if (payload.contains(k)) {
        return HandlerResult::Fail("field '" + internal::PrintableCut(k, 64) +
                                   "' is given twice in the entry, and the JSON on the "
                                   "handler's stdin holds one value per field; handler not run");
      }
      payload[k] = v;
    }
    c.stdin_data = payload.dump();
  } else {
    c.stdin_data = d.payload();
  }
  c.env = {"DEDUP_KEY=" + d.key(), "DEDUP_FENCE=" + std::to_string(fence),
           "DEDUP_ATTEMPT=" + std::to_string(attempt), "DEDUP_ENTRY_ID=" + d.id(),
           worker_pid_env_};
  c.capture_stdout = keep_output;
  c.max_output = options_.max_output;
  StatusOr<HandlerExit> r = supervisor_->Run(c, claim);
  // Debian's /bin/sh (dash) forks the command rather than replacing itself, and
  // reports a signal that ended it as exit 128+n: read as that signal, so that a
  // handler killed (by the OOM killer, say) is retried as it is without the
  // shell, not recorded failed and dead-lettered. A command that itself exits
  // 129 to 192 under the shell is read the same way (docs/WORKER.md).
  if (r.ok() && options_.shell && r->how == HandlerExit::How::kExited && r->code > 128 &&
      r->code <= 128 + kMaxSignal) {
    r->how = HandlerExit::How::kSignaled;
    r->signal = r->code - 128;
    r->via_shell = true;
  }
  if (r.ok() && Judge(*r) == HandlerVerdict::kDone && keep_output && r->truncated) {
    // Never keep (or, with --sql-output, run) a cut-off output.
    return HandlerResult::Fail("handler output exceeds " + std::to_string(options_.max_output) +
                               " bytes");
  }
  return ToHandlerResult(r, keep_output);
}

}  // namespace dedup

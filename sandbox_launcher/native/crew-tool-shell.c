/*
 * crew-tool-shell: every Linux sandbox's $SHELL, and the engine's own git and rg,
 * without an interpreter (sandbox_launcher/tool_shell.py writes the scripts that run it).
 *
 * The same program as `landlock.tool_shell` and `landlock.engine_child` in Python,
 * rule for rule; the Python one stays the fallback when this is not built. Each bash
 * tool call OpenCode makes (`$SHELL -c COMMAND`) starts here, so it must be cheap:
 * a static binary, a handful of syscalls, then exec.
 *
 *   crew-tool-shell --tool-shell MODE ARGS...          nest a tool domain, exec `bash ARGS...`
 *   crew-tool-shell --engine-child MODE NAME REAL ARGS...   the same, then exec REAL as NAME
 *
 * and the same two as one argument, the form a `#!` line gives (the kernel passes the
 * script's path next, which is dropped):
 *
 *   #!/path/crew-tool-shell --tool-shell=MODE
 *   #!/path/crew-tool-shell --engine-child=MODE:NAME:REAL
 *
 * What it does, as the Python does (keep them the same; tests/launcher/test_tool_shell.py
 * runs both):
 * - Nest a Landlock domain below the engine's (once: CREW_TOOL_DOMAIN marks a tool that
 *   has one), restricting no file: below a file-handling domain (hybrid) handle READ_FILE
 *   and REFER and grant both on `/`; below a scopes-only domain or none (tmpfs) only
 *   scope (abstract Unix sockets, signals) when the ABI can (6+), else the same whole-tree
 *   grant. No Landlock at all: nothing to nest in (the launcher's health says so).
 * - Remove the engine's secrets (ENGINE_ONLY) from the environment.
 * - Take the engine's own bin directory (`crew-engine-bin`) off PATH.
 * - A tool: exec `bash` from PATH (as `os.execvp`: the first error other than "not
 *   there" wins), else `/bin/sh` (OpenCode's own fallback).
 * - An engine child: exec REAL as NAME; git without system or global config; an
 *   empty REAL says the program is not installed (exit 127).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The same numbers on every architecture (landlock.py). */
#define SYS_CREATE_RULESET 444
#define SYS_ADD_RULE 445
#define SYS_RESTRICT_SELF 446
#define CREATE_RULESET_VERSION 1U
#define RULE_PATH_BENEATH 1
#define READ_FILE (1ULL << 2)
#define REFER (1ULL << 13)
#define SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define SCOPE_SIGNAL (1ULL << 1)
#define SCOPED (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
#define SCOPE_ABI 6

#define EXIT_SETUP_FAILED 126
#define EXIT_NOT_FOUND 127

#define TOOL_DOMAIN_MARKER "CREW_TOOL_DOMAIN"
#define TOOL_SHELL "bash"
#define FALLBACK_SHELL "/bin/sh"
#define DEFAULT_PATH "/bin:/usr/bin"
#define ENGINE_BIN_SUFFIX "/crew-engine-bin"

/* landlock.ENGINE_ONLY_VARIABLES: OpenCode read them at its start; no tool needs them. */
static const char *const ENGINE_ONLY[] = {
    "OPENCODE_SERVER_PASSWORD",
    "OPENCODE_AUTH_CONTENT",
    "OPENCODE_CONFIG_CONTENT",
    NULL,
};

struct __attribute__((packed)) path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
};

static const char *who = "crew-tool-shell";

static void fail_errno(const char *what) {
    int err = errno;
    fprintf(stderr, "%s: %s failed: %s (errno %d); the command was not started\n", who, what,
            strerror(err), err);
}

static long landlock_abi(void) {
    long version = syscall(SYS_CREATE_RULESET, NULL, 0, CREATE_RULESET_VERSION);
    return version < 0 ? 0 : version;
}

/* A ruleset handling `handled` with `scoped`; -1 after saying why. */
static int create_ruleset(uint64_t handled, uint64_t scoped) {
    /* handled_access_fs, handled_access_net, scoped: older kernels know only the first. */
    uint64_t attr[3] = {handled, 0, scoped};
    size_t size = scoped ? sizeof attr : sizeof attr[0];
    long fd = syscall(SYS_CREATE_RULESET, attr, size, 0U);
    if (fd < 0) {
        fail_errno("landlock_create_ruleset");
        return -1;
    }
    return (int)fd;
}

static int restrict_self(int ruleset) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        fail_errno("prctl(PR_SET_NO_NEW_PRIVS)");
        return -1;
    }
    if (syscall(SYS_RESTRICT_SELF, ruleset, 0U) < 0) {
        fail_errno("landlock_restrict_self");
        return -1;
    }
    close(ruleset);
    return 0;
}

/* landlock.nest_tool_domain: a domain below this one that restricts no file. */
static int nest_tool_domain(int outer_handles_files) {
    long version = landlock_abi();
    if (version == 0)
        return 0;
    uint64_t scoped = version >= SCOPE_ABI ? SCOPED : 0;
    if (scoped && !outer_handles_files) {
        int ruleset = create_ruleset(0, scoped);
        return ruleset < 0 ? -1 : restrict_self(ruleset);
    }
    uint64_t handled = READ_FILE | (version >= 2 ? REFER : 0);
    int ruleset = create_ruleset(handled, scoped);
    if (ruleset < 0)
        return -1;
    int root = open("/", O_PATH | O_CLOEXEC);
    if (root < 0) {
        int err = errno;
        fprintf(stderr, "%s: cannot open allowed path '/': %s; the command was not started\n",
                who, strerror(err));
        return -1;
    }
    struct path_beneath_attr rule = {.allowed_access = (READ_FILE | REFER) & handled,
                                     .parent_fd = root};
    if (syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, &rule, 0U) < 0) {
        fail_errno("landlock_add_rule('/')");
        return -1;
    }
    close(root);
    return restrict_self(ruleset);
}

static int valid_mode(const char *mode) {
    return strcmp(mode, "hybrid") == 0 || strcmp(mode, "tmpfs") == 0;
}

/* Nest a tool domain (once: the marker), drop the engine's secrets; -1 on failure. */
static int enter_tool_domain(const char *mode) {
    if (getenv(TOOL_DOMAIN_MARKER) == NULL) {
        if (nest_tool_domain(strcmp(mode, "hybrid") == 0) != 0)
            return -1;
        if (setenv(TOOL_DOMAIN_MARKER, "1", 1) != 0) {
            fail_errno("setenv");
            return -1;
        }
    }
    for (const char *const *name = ENGINE_ONLY; *name; name++)
        unsetenv(*name);
    return 0;
}

/* Does this PATH entry (trailing slashes aside) end in /crew-engine-bin? */
static int is_engine_bin(const char *entry, size_t length) {
    while (length > 0 && entry[length - 1] == '/')
        length--;
    size_t suffix = sizeof ENGINE_BIN_SUFFIX - 1;
    return length >= suffix && memcmp(entry + length - suffix, ENGINE_BIN_SUFFIX, suffix) == 0;
}

/* landlock.without_engine_bin, in place in the environment. */
static int drop_engine_bin(void) {
    const char *path = getenv("PATH");
    if (path == NULL)
        return 0;
    size_t size = strlen(path) + 1;
    char *kept = malloc(size);
    if (kept == NULL) {
        fail_errno("malloc");
        return -1;
    }
    char *out = kept;
    int first = 1;
    const char *entry = path;
    for (;;) {
        const char *end = strchr(entry, ':');
        size_t length = end ? (size_t)(end - entry) : strlen(entry);
        if (!is_engine_bin(entry, length)) {
            if (!first)
                *out++ = ':';
            memcpy(out, entry, length);
            out += length;
            first = 0;
        }
        if (end == NULL)
            break;
        entry = end + 1;
    }
    *out = '\0';
    if (setenv("PATH", kept, 1) != 0) {
        fail_errno("setenv");
        return -1;
    }
    free(kept);
    return 0;
}

/* `os.execvp` as landlock._exec does it: returns the error to report. */
static int exec_from_path(const char *name, char **argv) {
    const char *path = getenv("PATH");
    if (path == NULL)
        path = DEFAULT_PATH;
    int first_error = 0, last_error = ENOENT;
    size_t name_length = strlen(name);
    const char *entry = path;
    for (;;) {
        const char *end = strchr(entry, ':');
        size_t length = end ? (size_t)(end - entry) : strlen(entry);
        const char *dir = length ? entry : ".";
        size_t dir_length = length ? length : 1;
        char *candidate = malloc(dir_length + name_length + 2);
        if (candidate == NULL)
            return errno;
        memcpy(candidate, dir, dir_length);
        candidate[dir_length] = '/';
        memcpy(candidate + dir_length + 1, name, name_length + 1);
        execv(candidate, argv);
        last_error = errno;
        if (last_error != ENOENT && last_error != ENOTDIR && first_error == 0)
            first_error = last_error;
        free(candidate);
        if (end == NULL)
            break;
        entry = end + 1;
    }
    return first_error ? first_error : last_error;
}

/* [first, rest[0], ..., rest[count - 1], NULL] */
static char **with_argv0(const char *first, char **rest, int count) {
    char **argv = calloc((size_t)count + 2, sizeof *argv);
    if (argv == NULL)
        return NULL;
    argv[0] = (char *)first;
    for (int i = 0; i < count; i++)
        argv[i + 1] = rest[i];
    return argv;
}

static int tool_shell(const char *mode, char **args, int count) {
    who = "crew-tool-shell";
    if (!valid_mode(mode)) {
        fprintf(stderr, "%s: expected hybrid or tmpfs, got '%s'\n", who, mode);
        return EXIT_SETUP_FAILED;
    }
    if (enter_tool_domain(mode) != 0)
        return EXIT_SETUP_FAILED;
    /* A tool's `git` is the real one, with the agent's own config. */
    if (drop_engine_bin() != 0)
        return EXIT_SETUP_FAILED;
    char **argv = with_argv0(TOOL_SHELL, args, count);
    if (argv == NULL) {
        fail_errno("calloc");
        return EXIT_SETUP_FAILED;
    }
    int err = exec_from_path(TOOL_SHELL, argv);
    if (err != ENOENT) {
        fprintf(stderr, "%s: cannot run %s: %s\n", who, TOOL_SHELL, strerror(err));
        return EXIT_SETUP_FAILED;
    }
    argv[0] = FALLBACK_SHELL;
    execv(FALLBACK_SHELL, argv);
    err = errno;
    fprintf(stderr, "%s: cannot run %s: %s\n", who, FALLBACK_SHELL, strerror(err));
    return EXIT_SETUP_FAILED;
}

static int engine_child(const char *mode, const char *name, const char *real, char **args,
                        int count) {
    who = "crew-engine-child";
    if (!valid_mode(mode)) {
        fprintf(stderr, "%s: expected MODE NAME PATH, got '%s'\n", who, mode);
        return EXIT_SETUP_FAILED;
    }
    if (real[0] == '\0') {
        fprintf(stderr,
                "crew: %s is not installed on this Computer (looked in /usr/local/bin, "
                "/usr/bin, /bin); install it for OpenCode's tools that need it\n",
                name);
        return EXIT_NOT_FOUND;
    }
    if (enter_tool_domain(mode) != 0)
        return EXIT_SETUP_FAILED;
    if (drop_engine_bin() != 0)
        return EXIT_SETUP_FAILED;
    if (strcmp(name, "git") == 0) {
        /* No filter, fsmonitor or alias a tool set with `git config --global`. */
        if (setenv("GIT_CONFIG_NOSYSTEM", "1", 1) != 0 ||
            setenv("GIT_CONFIG_GLOBAL", "/dev/null", 1) != 0) {
            fail_errno("setenv");
            return EXIT_SETUP_FAILED;
        }
    }
    char **argv = with_argv0(name, args, count);
    if (argv == NULL) {
        fail_errno("calloc");
        return EXIT_SETUP_FAILED;
    }
    execv(real, argv);
    int err = errno;
    fprintf(stderr, "%s: cannot run %s: %s\n", who, real, strerror(err));
    return EXIT_SETUP_FAILED;
}

/* `--engine-child=MODE:NAME:REAL` (REAL may hold colons: it is the rest). */
static int engine_child_joined(char *spec, char **args, int count) {
    char *name = strchr(spec, ':');
    char *real = name ? strchr(name + 1, ':') : NULL;
    if (real == NULL) {
        who = "crew-engine-child";
        fprintf(stderr, "%s: expected MODE:NAME:PATH, got '%s'\n", who, spec);
        return EXIT_SETUP_FAILED;
    }
    *name++ = '\0';
    *real++ = '\0';
    return engine_child(spec, name, real, args, count);
}

int main(int argc, char **argv) {
    static const char tool_joined[] = "--tool-shell=";
    static const char child_joined[] = "--engine-child=";
    if (argc >= 3 && strcmp(argv[1], "--tool-shell") == 0)
        return tool_shell(argv[2], argv + 3, argc - 3);
    if (argc >= 5 && strcmp(argv[1], "--engine-child") == 0)
        return engine_child(argv[2], argv[3], argv[4], argv + 5, argc - 5);
    /* From a `#!` line: argv[2] is the script's own path. */
    int skip = argc >= 3 ? 3 : argc;
    if (argc >= 2 && strncmp(argv[1], tool_joined, sizeof tool_joined - 1) == 0)
        return tool_shell(argv[1] + sizeof tool_joined - 1, argv + skip, argc - skip);
    if (argc >= 2 && strncmp(argv[1], child_joined, sizeof child_joined - 1) == 0)
        return engine_child_joined(argv[1] + sizeof child_joined - 1, argv + skip, argc - skip);
    if (argc >= 2 && strcmp(argv[1], "--engine-child") == 0) {
        who = "crew-engine-child";
        fprintf(stderr, "%s: expected MODE NAME PATH\n", who);
        return EXIT_SETUP_FAILED;
    }
    fprintf(stderr,
            "crew-tool-shell: expected --tool-shell MODE ARGS... or "
            "--engine-child MODE NAME PATH ARGS... (hybrid or tmpfs)\n");
    return EXIT_SETUP_FAILED;
}

// The options grammar shared by srun --zenflow-bind, plugstack.conf and the CLI. The text is
// hostile (slurmstepd parses it as root), so every length is bounded and every number is read
// by hand with its range checked before it can overflow.
#include "cbuf.hpp"
#include "error.hpp"
#include "quote.hpp"

#include <zbutil/decimal.hpp>

#include <charconv>
#include <cstring>
#include <string>
#include <string_view>

namespace {

using zb::quote_input;

constexpr size_t max_text = 8192;
constexpr unsigned max_cores = 4096;
// Longest fraction accepted; enough for any share of any machine, and it keeps the shortest
// fixed-point text of every accepted value inside the same bound (format -> parse round trip).
constexpr size_t max_fraction_digits = 30;

[[noreturn]] void bad_value(std::string_view key, std::string_view value, const char *accepted) {
    zb::fail(ZB_EINVAL, "bad value " + quote_input(value) + " for " + std::string(key) +
                            "= (accepted: " + accepted + ")");
}

// An integer lo..hi written in plain decimal, or nothing.
bool read_count(std::string_view s, unsigned lo, unsigned hi, unsigned &out) {
    const auto value = zb::util::parse_decimal(s, hi);
    if (!value || *value < lo) return false;
    out = static_cast<unsigned>(*value);
    return true;
}

// A fraction 0 < F < 1 written as [0].DIGITS, or nothing. std::from_chars rounds correctly and
// ignores the locale; the syntax is checked before it so that it never sees an exponent, a sign,
// "inf" or hex.
bool read_fraction(std::string_view s, double &out) {
    const size_t dot = s.find('.');
    if (dot == std::string_view::npos) return false;
    const std::string_view whole = s.substr(0, dot);
    const std::string_view digits = s.substr(dot + 1);
    if (!(whole.empty() || whole == "0")) return false;
    if (digits.empty() || digits.size() > max_fraction_digits || !zb::util::is_decimal(digits))
        return false;
    double value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size()) return false;
    if (!(value > 0 && value < 1)) return false;
    out = value;
    return true;
}

void apply_train(zb_options &o, std::string_view value) {
    unsigned cores = 0;
    double fraction = 0;
    if (read_count(value, 1, max_cores, cores)) {
        o.train_cores = cores;
        o.train_fraction = 0;
    } else if (read_fraction(value, fraction)) {
        o.train_fraction = fraction;
        o.train_cores = 0;
    } else {
        bad_value("train", value,
                  "cores 1..4096 such as train=8, or a fraction 0 < F < 1 such as train=0.5");
    }
    o.set |= ZB_SET_TRAIN;
}

void apply_opt(zb_options &o, std::string_view value) {
    if (!read_count(value, 1, max_cores, o.opt_cores)) bad_value("opt", value, "cores 1..4096");
    o.set |= ZB_SET_OPT;
}

// An absolute path into a fixed-size field (profile=, gpumap=).
void apply_path(char (&field)[ZB_OPTION_PATH_MAX], unsigned bit, zb_options &o,
                std::string_view key, std::string_view value) {
    bool ok = value.size() > 1 && value.front() == '/' && value.size() < ZB_OPTION_PATH_MAX;
    for (char c : value)
        ok = ok && static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
    if (!ok)
        bad_value(key, value, "an absolute path of at most 4095 bytes without control characters");
    std::memcpy(field, value.data(), value.size());
    field[value.size()] = '\0';
    o.set |= bit;
}

// on|off style admin switches: `word_on` sets the field to 1.
void apply_switch(int &field, unsigned bit, zb_options &o, std::string_view key,
                  std::string_view value, const char *word_on, const char *word_off) {
    if (value == word_on)
        field = 1;
    else if (value == word_off)
        field = 0;
    else
        bad_value(key, value, (std::string(word_on) + ", " + word_off).c_str());
    o.set |= bit;
}

// The value a C caller stored in an enum field, read as bytes: loading an out-of-range value
// through the enum type itself would be undefined behaviour.
template <class E> int enum_bits(const E &field) {
    int value;
    static_assert(sizeof value == sizeof field);
    std::memcpy(&value, &field, sizeof value);
    return value;
}

// Shortest fixed-point text that reads back as the same double: "0.5", never "5e-01".
std::string fraction_text(double f) {
    char buf[400];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::fixed);
    if (ec != std::errc()) zb::fail(ZB_EINTERNAL, "cannot print train fraction");
    return std::string(buf, end);
}

std::string format_train(const zb_options &o) {
    if (o.train_cores) return "train=" + std::to_string(o.train_cores);
    if (o.train_fraction == 0) return "";
    if (!(o.train_fraction > 0 && o.train_fraction < 1))
        zb::fail(ZB_EINVAL,
                 "train_fraction " + std::to_string(o.train_fraction) + " is outside 0 < F < 1");
    return "train=" + fraction_text(o.train_fraction);
}

// The keys whose value is one word of a list, the list's index being the enum's value (0 is the
// default): one table of names parses and formats each of them.
template <size_t N> using Names = const char *const[N];
Names<3> smt_names = {"idle", "train", "opt"};
Names<3> numa_names = {"prefer", "strict", "ignore"};
Names<2> mode_names = {"split", "offload"};
Names<2> gpu_names = {"near", "ignore"};

template <class E, size_t N>
void apply_enum(E &field, unsigned bit, zb_options &o, std::string_view key, std::string_view value,
                Names<N> &names) {
    for (size_t i = 0; i < N; ++i)
        if (value == names[i]) {
            field = static_cast<E>(i);
            o.set |= bit;
            return;
        }
    std::string accepted;
    for (size_t i = 0; i < N; ++i)
        accepted += (i ? ", " : "") + std::string(names[i]);
    bad_value(key, value, accepted.c_str());
}

template <class E, size_t N>
std::string format_enum(const E &field, const char *key, Names<N> &names) {
    const int value = enum_bits(field);
    if (value < 0 || static_cast<size_t>(value) >= N)
        zb::fail(ZB_EINVAL, std::string(key) + " holds no value of its enum");
    return value == 0 ? "" : std::string(key) + "=" + names[value];
}

std::string format_path(const char (&field)[ZB_OPTION_PATH_MAX], const char *key) {
    const size_t len = strnlen(field, sizeof field);
    if (len == sizeof field) zb::fail(ZB_EINVAL, std::string(key) + " is not NUL-terminated");
    return len ? std::string(key) + "=" + std::string(field, len) : "";
}

// One row per key: the only place a key is described. Parsing, formatting, the admin override
// check and the usage text all walk this table, so a new key is one row (and its man page entry).
struct Key {
    const char *name;
    unsigned bit;         // its ZB_SET_* bit (on and off share one)
    bool admin;           // plugstack.conf only
    bool takes_value;     // key=value, else a bare word
    const char *usage;    // in the usage text ("" when another row's usage covers it)
    const char *accepted; // shown with a missing or bad value
    void (*apply)(zb_options &, std::string_view);
    std::string (*format)(const zb_options &); // canonical item, "" at the default
    bool (*same)(const zb_options &, const zb_options &);
};

#define ZB_SAME(field) [](const zb_options &a, const zb_options &b) { return a.field == b.field; }
#define ZB_FLAG(field, bit)                                                                        \
    [](zb_options &o, std::string_view) {                                                          \
        o.field = 1;                                                                               \
        o.set |= bit;                                                                              \
    }

const Key keys[] = {
    {"on", ZB_SET_ENABLED, false, false, "on|off", "on",
     [](zb_options &o, std::string_view) {
         o.enabled = 1;
         o.set |= ZB_SET_ENABLED;
     },
     [](const zb_options &) { return std::string(); }, ZB_SAME(enabled)},
    {"off", ZB_SET_ENABLED, false, false, "", "off",
     [](zb_options &o, std::string_view) {
         o.enabled = 0;
         o.set |= ZB_SET_ENABLED;
     },
     [](const zb_options &o) { return std::string(o.enabled ? "" : "off"); }, ZB_SAME(enabled)},
    {"train", ZB_SET_TRAIN, false, true, "train=N|F",
     "cores 1..4096 such as train=8, or a fraction 0 < F < 1 such as train=0.5", apply_train,
     format_train,
     [](const zb_options &a, const zb_options &b) {
         return a.train_cores == b.train_cores && a.train_fraction == b.train_fraction;
     }},
    {"opt", ZB_SET_OPT, false, true, "opt=N", "cores 1..4096", apply_opt,
     [](const zb_options &o) { return o.opt_cores ? "opt=" + std::to_string(o.opt_cores) : ""; },
     ZB_SAME(opt_cores)},
    {"smt", ZB_SET_SMT, false, true, "smt=idle|train|opt", "idle, train, opt",
     [](zb_options &o, std::string_view v) {
         apply_enum(o.smt, ZB_SET_SMT, o, "smt", v, smt_names);
     },
     [](const zb_options &o) { return format_enum(o.smt, "smt", smt_names); }, ZB_SAME(smt)},
    {"numa", ZB_SET_NUMA, false, true, "numa=prefer|strict|ignore", "prefer, strict, ignore",
     [](zb_options &o, std::string_view v) {
         apply_enum(o.numa, ZB_SET_NUMA, o, "numa", v, numa_names);
     },
     [](const zb_options &o) { return format_enum(o.numa, "numa", numa_names); }, ZB_SAME(numa)},
    {"profile", ZB_SET_PROFILE, false, true, "profile=PATH", "an absolute path",
     [](zb_options &o, std::string_view v) {
         apply_path(o.profile, ZB_SET_PROFILE, o, "profile", v);
     },
     [](const zb_options &o) { return format_path(o.profile, "profile"); },
     [](const zb_options &a, const zb_options &b) {
         return std::strncmp(a.profile, b.profile, sizeof a.profile) == 0;
     }},
    {"verbose", ZB_SET_VERBOSE, false, false, "verbose", "verbose",
     ZB_FLAG(verbose, ZB_SET_VERBOSE),
     [](const zb_options &o) { return std::string(o.verbose ? "verbose" : ""); }, ZB_SAME(verbose)},
    {"batch", ZB_SET_BATCH, false, false, "batch", "batch", ZB_FLAG(batch, ZB_SET_BATCH),
     [](const zb_options &o) { return std::string(o.batch ? "batch" : ""); }, ZB_SAME(batch)},
    {"mode", ZB_SET_MODE, false, true, "mode=split|offload", "split, offload",
     [](zb_options &o, std::string_view v) {
         apply_enum(o.mode, ZB_SET_MODE, o, "mode", v, mode_names);
     },
     [](const zb_options &o) { return format_enum(o.mode, "mode", mode_names); }, ZB_SAME(mode)},
    {"gpu", ZB_SET_GPU, false, true, "gpu=near|ignore", "near, ignore",
     [](zb_options &o, std::string_view v) {
         apply_enum(o.gpu, ZB_SET_GPU, o, "gpu", v, gpu_names);
     },
     [](const zb_options &o) { return format_enum(o.gpu, "gpu", gpu_names); }, ZB_SAME(gpu)},
    {"default", ZB_SET_DEFAULT, true, true, "default=on|off", "on, off",
     [](zb_options &o, std::string_view v) {
         apply_switch(o.default_on, ZB_SET_DEFAULT, o, "default", v, "on", "off");
     },
     [](const zb_options &o) { return std::string(o.default_on ? "default=on" : ""); },
     ZB_SAME(default_on)},
    {"override", ZB_SET_OVERRIDE, true, true, "override=allow|deny", "allow, deny",
     [](zb_options &o, std::string_view v) {
         apply_switch(o.allow_override, ZB_SET_OVERRIDE, o, "override", v, "allow", "deny");
     },
     [](const zb_options &o) { return std::string(o.allow_override ? "" : "override=deny"); },
     ZB_SAME(allow_override)},
    {"onerror", ZB_SET_ONERROR, true, true, "onerror=fail|warn", "fail, warn",
     [](zb_options &o, std::string_view v) {
         apply_switch(o.fail_on_error, ZB_SET_ONERROR, o, "onerror", v, "fail", "warn");
     },
     [](const zb_options &o) { return std::string(o.fail_on_error ? "onerror=fail" : ""); },
     ZB_SAME(fail_on_error)},
    {"gpumap", ZB_SET_GPUMAP, true, true, "gpumap=PATH", "an absolute path",
     [](zb_options &o, std::string_view v) { apply_path(o.gpumap, ZB_SET_GPUMAP, o, "gpumap", v); },
     [](const zb_options &o) { return format_path(o.gpumap, "gpumap"); },
     [](const zb_options &a, const zb_options &b) {
         return std::strncmp(a.gpumap, b.gpumap, sizeof a.gpumap) == 0;
     }},
};

#undef ZB_SAME
#undef ZB_FLAG

// "on, off, train=, ..." for error messages: the keys a scope accepts.
std::string key_names(zb_scope scope) {
    std::string out;
    for (const Key &k : keys) {
        if (k.admin && scope != ZB_SCOPE_ADMIN) continue;
        out += out.empty() ? "" : ", ";
        out += std::string(k.name) + (k.takes_value ? "=" : "");
    }
    return out;
}

std::string usage_text(zb_scope scope) {
    std::string out;
    for (const Key &k : keys) {
        if ((k.admin && scope != ZB_SCOPE_ADMIN) || !*k.usage) continue;
        out += out.empty() ? "" : ", ";
        out += k.usage;
    }
    return out;
}

void apply_item(zb_options &o, std::string_view item, zb_scope scope) {
    const size_t eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    const Key *key = nullptr;
    for (const Key &k : keys)
        if (name == k.name) key = &k;
    if (!key)
        zb::fail(ZB_EINVAL,
                 "unknown key " + quote_input(name) + " (accepted keys: " + key_names(scope) + ")");
    if (key->admin && scope != ZB_SCOPE_ADMIN)
        zb::fail(ZB_EINVAL,
                 "key '" + std::string(key->name) + "' is admin-only (set it in plugstack.conf)");
    if (!key->takes_value && eq != std::string_view::npos)
        zb::fail(ZB_EINVAL, "key '" + std::string(key->name) + "' takes no value, got " +
                                quote_input(item) + " (accepted: " + key->accepted + ")");
    if (key->takes_value && (eq == std::string_view::npos || eq + 1 == item.size()))
        zb::fail(ZB_EINVAL, "missing value for " + std::string(key->name) +
                                "= (accepted: " + key->accepted + ")");
    key->apply(o, eq == std::string_view::npos ? std::string_view() : item.substr(eq + 1));
}

void parse_options(zb_options &o, std::string_view text, zb_scope scope) {
    if (text.size() > max_text)
        zb::fail(ZB_EINVAL, "options text is longer than " + std::to_string(max_text) +
                                " bytes (not accepted)");
    for (size_t i = 0; i < text.size(); ++i)
        if (text[i] == ' ' || (text[i] >= '\t' && text[i] <= '\r'))
            zb::fail(ZB_EINVAL, "whitespace in options " + quote_input(text, i) + " at character " +
                                    std::to_string(i + 1) +
                                    " (not allowed: write key[=value] items separated by commas "
                                    "only)");
    size_t begin = 0;
    while (!text.empty()) {
        const size_t comma = text.find(',', begin);
        const size_t end = comma == std::string_view::npos ? text.size() : comma;
        if (end == begin)
            zb::fail(ZB_EINVAL, "empty item in options " + quote_input(text, begin) +
                                    " at character " + std::to_string(begin + 1) +
                                    " (remove the extra comma)");
        apply_item(o, text.substr(begin, end - begin), scope);
        if (comma == std::string_view::npos) break;
        begin = comma + 1;
    }
}

std::string format_options(const zb_options &o) {
    std::string out;
    for (const Key &k : keys) {
        const std::string item = k.format(o);
        if (item.empty()) continue;
        out += out.empty() ? "" : ",";
        out += item;
    }
    return out;
}

} // namespace

extern "C" {

void zb_options_init_size(zb_options *options, size_t size) {
    if (!zb::init_sized(options, size)) return;
    options->enabled = 1;
    options->smt = ZB_SMT_IDLE;
    options->numa = ZB_NUMA_PREFER;
    options->allow_override = 1;
    options->gpu = ZB_GPU_NEAR;
}

zb_status zb_options_parse(zb_options *options, const char *text, zb_scope scope) {
    return zb::guard([&] {
        if (!options) zb::fail(ZB_EINVAL, "zb_options_parse: options is NULL");
        zb::check_size(options->size, sizeof *options, "zb_options_parse", "options",
                       "zb_options_init");
        if (const int s = enum_bits(scope); s != ZB_SCOPE_USER && s != ZB_SCOPE_ADMIN)
            zb::fail(ZB_EINVAL, "zb_options_parse: scope is neither ZB_SCOPE_USER nor "
                                "ZB_SCOPE_ADMIN");
        if (!text) return;
        // Bounded before strlen walks it: hostile text need not be NUL-terminated early.
        const size_t len = strnlen(text, max_text + 1);
        zb_options draft = *options; // applied only if every item is valid
        parse_options(draft, std::string_view(text, len), scope);
        *options = draft;
    });
}

int zb_options_format(const zb_options *options, char *buf, size_t len) {
    int result = -1;
    const zb_status status = zb::guard([&] {
        if (!options) zb::fail(ZB_EINVAL, "zb_options_format: options is NULL");
        zb::check_size(options->size, sizeof *options, "zb_options_format", "options",
                       "zb_options_init");
        result = static_cast<int>(zb::copy_to_buffer(format_options(*options), buf, len));
    });
    if (status != ZB_OK && buf && len > 0) buf[0] = '\0';
    return result;
}

int zb_options_usage(zb_scope scope, char *buf, size_t len) {
    int result = -1;
    const zb_status status = zb::guard([&] {
        if (const int s = enum_bits(scope); s != ZB_SCOPE_USER && s != ZB_SCOPE_ADMIN)
            zb::fail(ZB_EINVAL, "zb_options_usage: scope is neither ZB_SCOPE_USER nor "
                                "ZB_SCOPE_ADMIN");
        result = static_cast<int>(zb::copy_to_buffer(usage_text(scope), buf, len));
    });
    if (status != ZB_OK && buf && len > 0) buf[0] = '\0';
    return result;
}

const char *zb_options_overridden(const zb_options *admin, const zb_options *merged,
                                  unsigned user_set) {
    if (!admin || !merged || admin->size < sizeof *admin || merged->size < sizeof *merged)
        return nullptr;
    for (const Key &k : keys)
        if (!k.admin && (user_set & k.bit) && (admin->set & k.bit) && !k.same(*admin, *merged))
            return k.name;
    return nullptr;
}
}

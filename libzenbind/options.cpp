// The options grammar shared by srun --zenflow-bind, plugstack.conf and the CLI. The text is
// hostile (slurmstepd parses it as root), so every length is bounded and every number is read
// by hand with its range checked before it can overflow.
#include "cbuf.hpp"
#include "cpulist.hpp"
#include "error.hpp"

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

constexpr const char *user_keys = "on, off, train=, opt=, smt=, numa=, profile=, verbose, batch";
constexpr const char *admin_keys = "default=, override=, onerror=";

[[noreturn]] void bad_value(std::string_view key, std::string_view value, const char *accepted) {
    zb::fail(ZB_EINVAL, "bad value " + quote_input(value) + " for " + std::string(key) +
                            "= (accepted: " + accepted + ")");
}

bool all_digits(std::string_view s) {
    for (char c : s)
        if (c < '0' || c > '9') return false;
    return true;
}

// An integer lo..hi written in plain decimal, or nothing.
bool read_count(std::string_view s, unsigned lo, unsigned hi, unsigned &out) {
    if (s.empty() || !all_digits(s)) return false;
    unsigned long value = 0;
    for (char c : s) {
        value = value * 10 + static_cast<unsigned>(c - '0');
        if (value > hi) return false;
    }
    if (value < lo) return false;
    out = static_cast<unsigned>(value);
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
    if (digits.empty() || digits.size() > max_fraction_digits || !all_digits(digits)) return false;
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

void apply_smt(zb_options &o, std::string_view value) {
    if (value == "idle")
        o.smt = ZB_SMT_IDLE;
    else if (value == "train")
        o.smt = ZB_SMT_TRAIN;
    else if (value == "opt")
        o.smt = ZB_SMT_OPT;
    else
        bad_value("smt", value, "idle, train, opt");
    o.set |= ZB_SET_SMT;
}

void apply_numa(zb_options &o, std::string_view value) {
    if (value == "prefer")
        o.numa = ZB_NUMA_PREFER;
    else if (value == "strict")
        o.numa = ZB_NUMA_STRICT;
    else if (value == "ignore")
        o.numa = ZB_NUMA_IGNORE;
    else
        bad_value("numa", value, "prefer, strict, ignore");
    o.set |= ZB_SET_NUMA;
}

void apply_profile(zb_options &o, std::string_view value) {
    bool ok = value.size() > 1 && value.front() == '/' && value.size() < ZB_PROFILE_PATH_MAX;
    for (char c : value)
        ok = ok && static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
    if (!ok)
        bad_value("profile", value,
                  "an absolute path of at most 4095 bytes without control characters");
    std::memcpy(o.profile, value.data(), value.size());
    o.profile[value.size()] = '\0';
    o.set |= ZB_SET_PROFILE;
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

struct Key {
    const char *name;
    bool takes_value;
    bool admin;
    const char *accepted; // shown when the value is missing
    void (*apply)(zb_options &, std::string_view);
};

const Key keys[] = {
    {"on", false, false, "on",
     [](zb_options &o, std::string_view) {
         o.enabled = 1;
         o.set |= ZB_SET_ENABLED;
     }},
    {"off", false, false, "off",
     [](zb_options &o, std::string_view) {
         o.enabled = 0;
         o.set |= ZB_SET_ENABLED;
     }},
    {"train", true, false,
     "cores 1..4096 such as train=8, or a fraction 0 < F < 1 such as train=0.5", apply_train},
    {"opt", true, false, "cores 1..4096", apply_opt},
    {"smt", true, false, "idle, train, opt", apply_smt},
    {"numa", true, false, "prefer, strict, ignore", apply_numa},
    {"profile", true, false, "an absolute path", apply_profile},
    {"verbose", false, false, "verbose",
     [](zb_options &o, std::string_view) {
         o.verbose = 1;
         o.set |= ZB_SET_VERBOSE;
     }},
    {"batch", false, false, "batch",
     [](zb_options &o, std::string_view) {
         o.batch = 1;
         o.set |= ZB_SET_BATCH;
     }},
    {"default", true, true, "on, off",
     [](zb_options &o, std::string_view v) {
         apply_switch(o.default_on, ZB_SET_DEFAULT, o, "default", v, "on", "off");
     }},
    {"override", true, true, "allow, deny",
     [](zb_options &o, std::string_view v) {
         apply_switch(o.allow_override, ZB_SET_OVERRIDE, o, "override", v, "allow", "deny");
     }},
    {"onerror", true, true, "fail, warn",
     [](zb_options &o, std::string_view v) {
         apply_switch(o.fail_on_error, ZB_SET_ONERROR, o, "onerror", v, "fail", "warn");
     }},
};

void apply_item(zb_options &o, std::string_view item, zb_scope scope) {
    const size_t eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    const Key *key = nullptr;
    for (const Key &k : keys)
        if (name == k.name) key = &k;
    if (!key) {
        std::string accepted = user_keys;
        if (scope == ZB_SCOPE_ADMIN) accepted += std::string(", ") + admin_keys;
        zb::fail(ZB_EINVAL,
                 "unknown key " + quote_input(name) + " (accepted keys: " + accepted + ")");
    }
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

std::string format_options(const zb_options &o) {
    std::string out;
    const auto add = [&out](const std::string &item) {
        if (!out.empty()) out += ',';
        out += item;
    };
    if (!o.enabled) add("off");
    if (o.train_cores)
        add("train=" + std::to_string(o.train_cores));
    else if (o.train_fraction != 0) {
        if (!(o.train_fraction > 0 && o.train_fraction < 1))
            zb::fail(ZB_EINVAL, "train_fraction " + std::to_string(o.train_fraction) +
                                    " is outside 0 < F < 1");
        add("train=" + fraction_text(o.train_fraction));
    }
    if (o.opt_cores) add("opt=" + std::to_string(o.opt_cores));
    switch (enum_bits(o.smt)) {
    case ZB_SMT_IDLE:
        break;
    case ZB_SMT_TRAIN:
        add("smt=train");
        break;
    case ZB_SMT_OPT:
        add("smt=opt");
        break;
    default:
        zb::fail(ZB_EINVAL, "smt holds no zb_smt value");
    }
    switch (enum_bits(o.numa)) {
    case ZB_NUMA_PREFER:
        break;
    case ZB_NUMA_STRICT:
        add("numa=strict");
        break;
    case ZB_NUMA_IGNORE:
        add("numa=ignore");
        break;
    default:
        zb::fail(ZB_EINVAL, "numa holds no zb_numa value");
    }
    const size_t profile_len = strnlen(o.profile, sizeof o.profile);
    if (profile_len == sizeof o.profile) zb::fail(ZB_EINVAL, "profile is not NUL-terminated");
    if (profile_len > 0) add("profile=" + std::string(o.profile, profile_len));
    if (o.verbose) add("verbose");
    if (o.batch) add("batch");
    if (o.default_on) add("default=on");
    if (!o.allow_override) add("override=deny");
    if (o.fail_on_error) add("onerror=fail");
    return out;
}

} // namespace

extern "C" {

void zb_options_init(zb_options *options) {
    if (!options) return;
    std::memset(options, 0, sizeof *options);
    options->enabled = 1;
    options->smt = ZB_SMT_IDLE;
    options->numa = ZB_NUMA_PREFER;
    options->allow_override = 1;
}

zb_status zb_options_parse(zb_options *options, const char *text, zb_scope scope) {
    return zb::guard([&] {
        if (!options) zb::fail(ZB_EINVAL, "zb_options_parse: options is NULL");
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
        result = static_cast<int>(zb::copy_to_buffer(format_options(*options), buf, len));
    });
    if (status != ZB_OK && buf && len > 0) buf[0] = '\0';
    return result;
}
}

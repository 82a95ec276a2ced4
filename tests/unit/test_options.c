/* zb_options_init / zb_options_parse / zb_options_format: the options grammar. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zenbind/zenbind.h>

static zb_options parsed(const char *text, zb_scope scope) {
    zb_options o;
    zb_options_init(&o);
    if (zb_options_parse(&o, text, scope) != ZB_OK)
        fail_msg("parse '%s' failed: %s", text, zb_last_error());
    return o;
}

static const char *formatted(const zb_options *o) {
    static char buf[8192];
    const int n = zb_options_format(o, buf, sizeof buf);
    assert_int_equal(n, (int)strlen(buf));
    return buf;
}

/* Parses `text` onto a copy of `base`, which must fail with EINVAL and leave it unchanged. */
static const char *rejected_from(const zb_options *base, const char *text, zb_scope scope) {
    zb_options o = *base;
    zb_status st = zb_options_parse(&o, text, scope);
    if (st != ZB_EINVAL)
        fail_msg("parse '%.80s' gave %s, expected EINVAL", text, zb_status_name(st));
    assert_memory_equal(&o, base, sizeof o);
    assert_true(strlen(zb_last_error()) > 0);
    return zb_last_error();
}

static const char *rejected(const char *text, zb_scope scope) {
    zb_options base;
    zb_options_init(&base);
    return rejected_from(&base, text, scope);
}

static void assert_same_fields(const zb_options *a, const zb_options *b) {
    assert_int_equal(a->enabled, b->enabled);
    assert_int_equal(a->train_cores, b->train_cores);
    assert_true(a->train_fraction == b->train_fraction);
    assert_int_equal(a->opt_cores, b->opt_cores);
    assert_int_equal(a->smt, b->smt);
    assert_int_equal(a->numa, b->numa);
    assert_int_equal(a->verbose, b->verbose);
    assert_int_equal(a->batch, b->batch);
    assert_string_equal(a->profile, b->profile);
    assert_int_equal(a->default_on, b->default_on);
    assert_int_equal(a->allow_override, b->allow_override);
    assert_int_equal(a->fail_on_error, b->fail_on_error);
    assert_int_equal(a->gpu, b->gpu);
    assert_string_equal(a->gpumap, b->gpumap);
}

static void test_defaults(void **state) {
    (void)state;
    zb_options o;
    memset(&o, 0x5a, sizeof o);
    zb_options_init(&o);
    assert_int_equal(o.size, sizeof o);
    assert_int_equal(o.enabled, 1);
    assert_int_equal(o.train_cores, 0);
    assert_true(o.train_fraction == 0);
    assert_int_equal(o.opt_cores, 0);
    assert_int_equal(o.smt, ZB_SMT_IDLE);
    assert_int_equal(o.numa, ZB_NUMA_PREFER);
    assert_int_equal(o.verbose, 0);
    assert_int_equal(o.batch, 0);
    assert_string_equal(o.profile, "");
    assert_int_equal(o.default_on, 0);
    assert_int_equal(o.allow_override, 1);
    assert_int_equal(o.fail_on_error, 0);
    assert_int_equal(o.gpu, ZB_GPU_NEAR);
    assert_string_equal(o.gpumap, "");
    assert_int_equal(o.set, 0);
    assert_string_equal(formatted(&o), "");

    zb_options p = o;
    assert_int_equal(zb_options_parse(&p, NULL, ZB_SCOPE_USER), ZB_OK);
    assert_int_equal(zb_options_parse(&p, "", ZB_SCOPE_USER), ZB_OK);
    assert_memory_equal(&p, &o, sizeof o);
}

/* `text` parsed alone sets `field` to `value`, and of the ZB_SET_* bits only `bit`. */
#define EXPECT_KEY(text, scope, field, value, bit)                                                 \
    do {                                                                                           \
        const zb_options o_ = parsed(text, scope);                                                 \
        assert_int_equal(o_.field, value);                                                         \
        assert_int_equal(o_.set, bit);                                                             \
    } while (0)

/* train= alone: cores or a fraction, never both. */
static void expect_train(const char *text, unsigned cores, double fraction) {
    const zb_options o = parsed(text, ZB_SCOPE_USER);
    assert_int_equal(o.train_cores, cores);
    if (o.train_fraction != fraction)
        fail_msg("%s: fraction %.17g, expected %.17g", text, o.train_fraction, fraction);
    assert_int_equal(o.set, ZB_SET_TRAIN);
}

static void test_every_key(void **state) {
    (void)state;
    EXPECT_KEY("off", ZB_SCOPE_USER, enabled, 0, ZB_SET_ENABLED);
    EXPECT_KEY("on", ZB_SCOPE_USER, enabled, 1, ZB_SET_ENABLED);

    expect_train("train=8", 8, 0);
    expect_train("train=0.5", 0, 0.5);
    expect_train("train=.25", 0, 0.25);
    expect_train("train=4096", 4096, 0);
    expect_train("train=1", 1, 0);
    expect_train("train=0.999", 0, 0.999);

    EXPECT_KEY("opt=1", ZB_SCOPE_USER, opt_cores, 1, ZB_SET_OPT);
    EXPECT_KEY("opt=4096", ZB_SCOPE_USER, opt_cores, 4096, ZB_SET_OPT);

    EXPECT_KEY("smt=idle", ZB_SCOPE_USER, smt, ZB_SMT_IDLE, ZB_SET_SMT);
    EXPECT_KEY("smt=train", ZB_SCOPE_USER, smt, ZB_SMT_TRAIN, ZB_SET_SMT);
    EXPECT_KEY("smt=opt", ZB_SCOPE_USER, smt, ZB_SMT_OPT, ZB_SET_SMT);

    EXPECT_KEY("numa=prefer", ZB_SCOPE_USER, numa, ZB_NUMA_PREFER, ZB_SET_NUMA);
    EXPECT_KEY("numa=strict", ZB_SCOPE_USER, numa, ZB_NUMA_STRICT, ZB_SET_NUMA);
    EXPECT_KEY("numa=ignore", ZB_SCOPE_USER, numa, ZB_NUMA_IGNORE, ZB_SET_NUMA);

    EXPECT_KEY("mode=split", ZB_SCOPE_USER, mode, ZB_MODE_SPLIT, ZB_SET_MODE);
    EXPECT_KEY("mode=offload", ZB_SCOPE_USER, mode, ZB_MODE_OFFLOAD, ZB_SET_MODE);

    EXPECT_KEY("gpu=near", ZB_SCOPE_USER, gpu, ZB_GPU_NEAR, ZB_SET_GPU);
    EXPECT_KEY("gpu=ignore", ZB_SCOPE_USER, gpu, ZB_GPU_IGNORE, ZB_SET_GPU);

    zb_options o = parsed("profile=/etc/zenflow/a100.prof", ZB_SCOPE_USER);
    assert_string_equal(o.profile, "/etc/zenflow/a100.prof");
    assert_int_equal(o.set, ZB_SET_PROFILE);

    EXPECT_KEY("verbose", ZB_SCOPE_USER, verbose, 1, ZB_SET_VERBOSE);
    EXPECT_KEY("batch", ZB_SCOPE_USER, batch, 1, ZB_SET_BATCH);

    EXPECT_KEY("default=on", ZB_SCOPE_ADMIN, default_on, 1, ZB_SET_DEFAULT);
    EXPECT_KEY("default=off", ZB_SCOPE_ADMIN, default_on, 0, ZB_SET_DEFAULT);
    EXPECT_KEY("override=deny", ZB_SCOPE_ADMIN, allow_override, 0, ZB_SET_OVERRIDE);
    EXPECT_KEY("override=allow", ZB_SCOPE_ADMIN, allow_override, 1, ZB_SET_OVERRIDE);
    EXPECT_KEY("onerror=fail", ZB_SCOPE_ADMIN, fail_on_error, 1, ZB_SET_ONERROR);
    EXPECT_KEY("onerror=warn", ZB_SCOPE_ADMIN, fail_on_error, 0, ZB_SET_ONERROR);

    o = parsed("gpumap=/etc/slurm/gpus.map", ZB_SCOPE_ADMIN);
    assert_string_equal(o.gpumap, "/etc/slurm/gpus.map");
    assert_int_equal(o.set, ZB_SET_GPUMAP);
    assert_string_equal(formatted(&o), "gpumap=/etc/slurm/gpus.map");
    assert_string_equal(rejected("gpumap=/x", ZB_SCOPE_USER),
                        "key 'gpumap' is admin-only (set it in plugstack.conf)");
    rejected("gpumap=etc/gpus.map", ZB_SCOPE_ADMIN);
    rejected("gpu=closest", ZB_SCOPE_USER);

    /* user keys are admin keys too */
    o = parsed("train=3,opt=2,smt=train,numa=strict,verbose,batch,off", ZB_SCOPE_ADMIN);
    assert_int_equal(o.set, ZB_SET_TRAIN | ZB_SET_OPT | ZB_SET_SMT | ZB_SET_NUMA | ZB_SET_VERBOSE |
                                ZB_SET_BATCH | ZB_SET_ENABLED);
}

static void test_later_keys_win(void **state) {
    (void)state;
    zb_options o = parsed("train=0.5,train=6", ZB_SCOPE_USER);
    assert_int_equal(o.train_cores, 6); /* cores clear the fraction... */
    assert_true(o.train_fraction == 0);
    o = parsed("train=6,train=0.75", ZB_SCOPE_USER);
    assert_int_equal(o.train_cores, 0); /* ...and the fraction clears the cores */
    assert_true(o.train_fraction == 0.75);
    o = parsed("off,on", ZB_SCOPE_USER);
    assert_int_equal(o.enabled, 1);
    o = parsed("smt=opt,smt=idle", ZB_SCOPE_USER);
    assert_int_equal(o.smt, ZB_SMT_IDLE);
    assert_int_equal(o.set, ZB_SET_SMT);
}

/* plugstack.conf arguments first (admin scope), then the user's --zenflow-bind text. */
static void test_layering(void **state) {
    (void)state;
    zb_options o;
    zb_options_init(&o);
    assert_int_equal(
        zb_options_parse(&o, "default=on,onerror=fail,train=0.5,numa=strict", ZB_SCOPE_ADMIN),
        ZB_OK);
    assert_int_equal(zb_options_parse(&o, "override=deny", ZB_SCOPE_ADMIN), ZB_OK);
    assert_int_equal(zb_options_parse(&o, "train=4,opt=2,verbose", ZB_SCOPE_USER), ZB_OK);
    assert_int_equal(o.default_on, 1);
    assert_int_equal(o.fail_on_error, 1);
    assert_int_equal(o.allow_override, 0);
    assert_int_equal(o.numa, ZB_NUMA_STRICT); /* admin value kept where the user said nothing */
    assert_int_equal(o.train_cores, 4);       /* user value wins where given */
    assert_true(o.train_fraction == 0);
    assert_int_equal(o.opt_cores, 2);
    assert_int_equal(o.verbose, 1);
    assert_int_equal(o.set, ZB_SET_DEFAULT | ZB_SET_ONERROR | ZB_SET_TRAIN | ZB_SET_NUMA |
                                ZB_SET_OVERRIDE | ZB_SET_OPT | ZB_SET_VERBOSE);
    assert_string_equal(formatted(&o),
                        "train=4,opt=2,numa=strict,verbose,default=on,override=deny,onerror=fail");

    /* a bad user string leaves the admin's values exactly as they were */
    zb_options before = o;
    rejected_from(&before, "train=2,smt=bogus", ZB_SCOPE_USER);
    rejected_from(&before, "verbose,default=off", ZB_SCOPE_USER);
}

static void test_atomic_on_error(void **state) {
    (void)state;
    zb_options base = parsed("train=3,opt=1,profile=/a/b", ZB_SCOPE_USER);
    /* valid items before the bad one are not applied */
    rejected_from(&base, "train=7,opt=9,numa=ignore,profile=/c,verbose,batch,off,bad",
                  ZB_SCOPE_USER);
    rejected_from(&base, "train=7,opt=0", ZB_SCOPE_USER);
    rejected_from(&base, "profile=/x,", ZB_SCOPE_USER);
}

static void test_messages(void **state) {
    (void)state;
    /* what a user sees for each kind of mistake; hostile bytes are escaped */
    static const struct {
        const char *text;
        zb_scope scope;
        const char *message;
    } cases[] = {
        {"trian=2", ZB_SCOPE_USER,
         "unknown key 'trian' (accepted keys: on, off, train=, opt=, smt=, numa=, "
         "profile=, verbose, batch, mode=, gpu=)"},
        {"trian", ZB_SCOPE_ADMIN,
         "unknown key 'trian' (accepted keys: on, off, train=, opt=, smt=, numa=, "
         "profile=, verbose, batch, mode=, gpu=, default=, override=, onerror=, "
         "gpumap=)"},
        {"mode=inproc", ZB_SCOPE_USER, "bad value 'inproc' for mode= (accepted: split, offload)"},
        {"smt=x", ZB_SCOPE_USER, "bad value 'x' for smt= (accepted: idle, train, opt)"},
        {"numa=loose", ZB_SCOPE_USER,
         "bad value 'loose' for numa= (accepted: prefer, strict, ignore)"},
        {"train=0", ZB_SCOPE_USER,
         "bad value '0' for train= (accepted: cores 1..4096 such as train=8, or a "
         "fraction 0 < F < 1 such as train=0.5)"},
        {"opt=0", ZB_SCOPE_USER, "bad value '0' for opt= (accepted: cores 1..4096)"},
        {"profile=rel/x", ZB_SCOPE_USER,
         "bad value 'rel/x' for profile= (accepted: an absolute path of at most "
         "4095 bytes without control characters)"},
        {"default=on", ZB_SCOPE_USER, "key 'default' is admin-only (set it in plugstack.conf)"},
        {"override=allow", ZB_SCOPE_USER,
         "key 'override' is admin-only (set it in plugstack.conf)"},
        {"onerror=warn", ZB_SCOPE_USER, "key 'onerror' is admin-only (set it in plugstack.conf)"},
        {"default=yes", ZB_SCOPE_ADMIN, "bad value 'yes' for default= (accepted: on, off)"},
        {"override=no", ZB_SCOPE_ADMIN, "bad value 'no' for override= (accepted: allow, deny)"},
        {"onerror=abort", ZB_SCOPE_ADMIN, "bad value 'abort' for onerror= (accepted: fail, warn)"},
        {"verbose=1", ZB_SCOPE_USER,
         "key 'verbose' takes no value, got 'verbose=1' (accepted: verbose)"},
        {"off=", ZB_SCOPE_USER, "key 'off' takes no value, got 'off=' (accepted: off)"},
        {"smt", ZB_SCOPE_USER, "missing value for smt= (accepted: idle, train, opt)"},
        {"opt=", ZB_SCOPE_USER, "missing value for opt= (accepted: cores 1..4096)"},
        {"train=2,,opt=1", ZB_SCOPE_USER,
         "empty item in options 'train=2,,opt=1' at character 9 (remove the extra "
         "comma)"},
        {"verbose,", ZB_SCOPE_USER,
         "empty item in options 'verbose,' at character 9 (remove the extra comma)"},
        {"train=2, opt=1", ZB_SCOPE_USER,
         "whitespace in options 'train=2, opt=1' at character 9 (not allowed: write "
         "key[=value] items separated by commas only)"},
        {"smt=\x1b[2J", ZB_SCOPE_USER,
         "bad value '\\x1b[2J' for smt= (accepted: idle, train, opt)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i)
        assert_string_equal(rejected(cases[i].text, cases[i].scope), cases[i].message);
}

static void test_rejects(void **state) {
    (void)state;
    const char *bad[] = {/* train= */
                         "train=0", "train=1.0", "train=1.", "train=-1", "train=-0.5", "train=+2",
                         "train=0.0", "train=.0", "train=0.", "train=.", "train=1e2", "train=5e-1",
                         "train=0x10", "train=2x", "train=0.5x", "train=00.5", "train=4097",
                         "train=99999999999999999999", "train=inf", "train=nan", "train=0,5",
                         "train=0.9999999999999999999999", "train=1/2",
                         /* opt= */
                         "opt=0", "opt=4097", "opt=-1", "opt=1.5", "opt=0.5", "opt=1e3", "opt=0x2",
                         "opt=18446744073709551617", "opt=2cores",
                         /* others */
                         "smt=", "smt=IDLE", "numa=", "numa=Strict", "profile=", "profile=relative",
                         "profile=/", "profile=/a\x01", "ON", "Verbose", "verbose=", "batch=yes",
                         "on=1", "=on", "=", ",", ",verbose", "verbose,,", "key=value=more",
                         "opt==1", "\t", "verbose\n", "smt=idle\r", "default=on"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i)
        rejected(bad[i], ZB_SCOPE_USER);
    /* the fraction limit sits just below 1 and a hair above 0 */
    rejected("train=0.0000000000000000000000000000001", ZB_SCOPE_USER); /* too many digits */
    zb_options o = parsed("train=0.000000000000000000000000000001", ZB_SCOPE_USER);
    assert_true(o.train_fraction > 0);
}

static void test_bounds(void **state) {
    (void)state;
    /* a profile path as long as the field allows, and one byte more */
    char text[ZB_OPTION_PATH_MAX + 16];
    strcpy(text, "profile=/");
    size_t len = strlen(text);
    memset(text + len, 'p', ZB_OPTION_PATH_MAX - 2);
    text[len + ZB_OPTION_PATH_MAX - 2] = '\0';
    zb_options o = parsed(text, ZB_SCOPE_USER);
    assert_int_equal(strlen(o.profile), ZB_OPTION_PATH_MAX - 1);
    strcat(text, "p");
    rejected(text, ZB_SCOPE_USER);

    /* text longer than 8192 bytes is refused whole, even if each item is valid */
    size_t n = 9000;
    char *big = malloc(n + 1);
    assert_non_null(big);
    size_t at = 0;
    while (at + 8 < n)
        at += (size_t)sprintf(big + at, "verbose,");
    strcpy(big + at, "batch");
    assert_string_equal(rejected(big, ZB_SCOPE_USER),
                        "options text is longer than 8192 bytes (not accepted)");
    /* an unknown key of many bytes gives a short message */
    memset(big, 'k', n);
    big[n] = '\0';
    big[8000] = '\0';
    const char *msg = rejected(big, ZB_SCOPE_USER);
    assert_true(strlen(msg) < 250);
    free(big);
}

static void test_format_round_trip(void **state) {
    (void)state;
    const char *texts[] = {"",
                           "off",
                           "train=8",
                           "train=0.5",
                           "train=.125",
                           "train=0.1",
                           "train=0.333333333333333333",
                           "train=0.000000000000000000000000000001",
                           "opt=3,smt=opt,numa=ignore",
                           "smt=train,numa=strict,profile=/p/q.prof,verbose,batch",
                           "mode=offload",
                           "default=on,override=deny,onerror=fail,off",
                           "default=off,override=allow,onerror=warn,on",
                           "train=0.7,opt=1,smt=idle,numa=prefer"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; ++i) {
        zb_options a = parsed(texts[i], ZB_SCOPE_ADMIN);
        char text[8192];
        strcpy(text, formatted(&a));
        zb_options b = parsed(text, ZB_SCOPE_ADMIN);
        assert_same_fields(&a, &b);
        assert_string_equal(formatted(&b), text); /* canonical: a fixed point */
    }
    zb_options o = parsed("train=0.5,opt=2,smt=opt,profile=/x,verbose", ZB_SCOPE_USER);
    assert_string_equal(formatted(&o), "train=0.5,opt=2,smt=opt,profile=/x,verbose");
    /* zeroed but for its size, not initialised */
    assert_string_equal(formatted(&(zb_options){.size = sizeof(zb_options)}), "off,override=deny");

    /* snprintf semantics */
    char small[6];
    assert_int_equal(zb_options_format(&o, small, sizeof small), (int)strlen(formatted(&o)));
    assert_string_equal(small, "train");
    assert_int_equal(zb_options_format(&o, NULL, 0), (int)strlen(formatted(&o)));
    o.smt = (zb_smt)42;
    memset(small, 'x', sizeof small);
    assert_int_equal(zb_options_format(&o, small, sizeof small), -1);
    assert_string_equal(small, "");
    assert_int_equal(zb_options_format(NULL, small, sizeof small), -1);
}

static void test_null_arguments(void **state) {
    (void)state;
    assert_int_equal(zb_options_parse(NULL, "verbose", ZB_SCOPE_USER), ZB_EINVAL);
    assert_non_null(strstr(zb_last_error(), "NULL"));
    zb_options o;
    zb_options_init(&o);
    assert_int_equal(zb_options_parse(&o, "verbose", (zb_scope)7), ZB_EINVAL);
    zb_options_init(NULL); /* harmless */
}

/* zb_options_init_size records the caller's size; a call given a struct smaller than this
 * release's refuses it and changes nothing. */
static void test_size(void **state) {
    (void)state;
    /* a caller compiled against a later header, whose zb_options is longer: every field this
     * release knows is its default (the format names only opt=), the size is the caller's */
    struct {
        zb_options o;
        char later_fields[24];
    } longer = {0};
    zb_options_init_size(&longer.o, sizeof longer);
    assert_int_equal(longer.o.size, sizeof longer);
    assert_int_equal(zb_options_parse(&longer.o, "opt=2", ZB_SCOPE_USER), ZB_OK);
    assert_string_equal(formatted(&longer.o), "opt=2");
    assert_int_equal(longer.o.set, ZB_SET_OPT);

    const size_t smaller[] = {0, 8, offsetof(zb_options, gpumap), sizeof(zb_options) - 1};
    for (size_t i = 0; i < sizeof smaller / sizeof *smaller; ++i) {
        zb_options o;
        zb_options_init(&o);
        o.size = smaller[i];
        const zb_options before = o;
        assert_int_equal(zb_options_parse(&o, "opt=2", ZB_SCOPE_USER), ZB_EINVAL);
        assert_memory_equal(&o, &before, sizeof o);
        char size[32];
        snprintf(size, sizeof size, "options->size is %zu", smaller[i]);
        if (!strstr(zb_last_error(), size) || !strstr(zb_last_error(), "zb_options_init"))
            fail_msg("message \"%s\" lacks \"%s\" or zb_options_init", zb_last_error(), size);
        char buf[16];
        memset(buf, 'x', sizeof buf);
        assert_int_equal(zb_options_format(&o, buf, sizeof buf), -1);
        assert_string_equal(buf, "");
    }
}

/* The usage text lists every key of its scope with its values, and admin keys only for admins. */
static void test_usage(void **state) {
    (void)state;
    char user[1024], admin[1024];
    assert_true(zb_options_usage(ZB_SCOPE_USER, user, sizeof user) > 0);
    assert_true(zb_options_usage(ZB_SCOPE_ADMIN, admin, sizeof admin) > 0);
    const char *user_items[] = {
        "on|off",       "train=N|F", "opt=N", "smt=idle|train|opt", "numa=prefer|strict|ignore",
        "profile=PATH", "verbose",   "batch"};
    for (size_t i = 0; i < sizeof user_items / sizeof *user_items; ++i) {
        assert_non_null(strstr(user, user_items[i]));
        assert_non_null(strstr(admin, user_items[i]));
    }
    const char *admin_items[] = {"default=on|off", "override=allow|deny", "onerror=fail|warn"};
    for (size_t i = 0; i < sizeof admin_items / sizeof *admin_items; ++i) {
        assert_null(strstr(user, admin_items[i]));
        assert_non_null(strstr(admin, admin_items[i]));
    }
    assert_int_equal(zb_options_usage((zb_scope)7, user, sizeof user), -1);
    assert_string_equal(user, "");
}

/* override=deny: every user key the admin also set is checked, whatever its place in the table. */
static void test_overridden(void **state) {
    (void)state;
    static const char *const pairs[][3] = {
        {"train=2", "train=3", "train"},
        {"train=2", "train=0.5", "train"},
        {"opt=1", "opt=2", "opt"},
        {"smt=train", "smt=opt", "smt"},
        {"numa=strict", "numa=ignore", "numa"},
        {"profile=/a", "profile=/b", "profile"},
        {"off", "on", "on"},
        {"mode=offload", "mode=split", "mode"},
        {"gpu=ignore", "gpu=near", "gpu"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; ++i) {
        const zb_options admin = parsed(pairs[i][0], ZB_SCOPE_ADMIN);
        const zb_options user = parsed(pairs[i][1], ZB_SCOPE_USER);
        zb_options merged = admin;
        assert_int_equal(zb_options_parse(&merged, pairs[i][1], ZB_SCOPE_USER), ZB_OK);
        const char *key = zb_options_overridden(&admin, &merged, user.set);
        if (!key || strcmp(key, pairs[i][2]) != 0)
            fail_msg("admin '%s', user '%s': got %s, expected %s", pairs[i][0], pairs[i][1],
                     key ? key : "NULL", pairs[i][2]);
        /* Restating the admin's value, or a key the admin did not set, is no override. */
        zb_options same = admin;
        assert_int_equal(zb_options_parse(&same, pairs[i][0], ZB_SCOPE_USER), ZB_OK);
        assert_null(zb_options_overridden(&admin, &same, parsed(pairs[i][0], ZB_SCOPE_USER).set));
        zb_options open;
        zb_options_init(&open);
        assert_null(zb_options_overridden(&open, &merged, user.set));
    }
    assert_null(zb_options_overridden(NULL, NULL, ~0u));
}

/* Every key of the table is documented in zenflow_bind(8) and reachable by the fuzzer's
 * dictionary: adding a key without either fails here. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    static char text[1 << 20];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    return text;
}

static void test_every_key_documented(void **state) {
    (void)state;
    char usage[1024];
    assert_true(zb_options_usage(ZB_SCOPE_ADMIN, usage, sizeof usage) > 0);
    char *save = NULL;
    for (char *item = strtok_r(usage, ", ", &save); item; item = strtok_r(NULL, ", ", &save)) {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)strcspn(item, "=|"), item);
        /* A tagged paragraph whose tag starts with the key, or names it as an alternative. */
        const char *man = slurp(ZB_SOURCE_DIR "/man/zenflow_bind.8");
        const char *forms[] = {".TP\n.B %s", ".TP\n.BI %s", ".TP\n.BR %s", " | \\fB%s"};
        int found = 0;
        for (size_t f = 0; f < sizeof forms / sizeof *forms && !found; ++f) {
            char pattern[96];
            snprintf(pattern, sizeof pattern, forms[f], key);
            for (const char *at = strstr(man, pattern); at && !found;
                 at = strstr(at + 1, pattern)) {
                const char next = at[strlen(pattern)];
                found = next == '=' || next == '\n' || next == '\\' || next == ' ';
            }
        }
        if (!found) fail_msg("key '%s' has no tagged paragraph in man/zenflow_bind.8", key);
        char dict_pattern[96];
        snprintf(dict_pattern, sizeof dict_pattern, "\"%s", key);
        if (!strstr(slurp(ZB_SOURCE_DIR "/tests/fuzz/options.dict"), dict_pattern))
            fail_msg("key '%s' is not in tests/fuzz/options.dict", key);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_every_key),
        cmocka_unit_test(test_later_keys_win),
        cmocka_unit_test(test_layering),
        cmocka_unit_test(test_atomic_on_error),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_format_round_trip),
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_overridden),
        cmocka_unit_test(test_every_key_documented),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* A fake file-system root for the readers that take one (cgroups, GPUs): a temporary directory,
 * files written into it with their directories, and its removal. A test includes this after
 * cmocka.h, defines ZB_FAKE_TREE_NAME ("zb_gpu"), and uses fake_tree_setup/teardown as the
 * group's setup and teardown. */
#ifndef ZB_TESTS_FAKE_TREE_H
#define ZB_TESTS_FAKE_TREE_H

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

/* Writes `content` to root/relpath, creating the directories on the way. */
static void put(const char *relpath, const char *content) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, relpath);
    for (char *slash = strchr(path + strlen(root) + 1, '/'); slash;
         slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            fail_msg("mkdir %s: %s", path, strerror(errno));
        *slash = '/';
    }
    FILE *f = fopen(path, "w");
    if (!f) fail_msg("fopen %s: %s", path, strerror(errno));
    fputs(content, f);
    fclose(f);
}

static int fake_tree_remove_entry(const char *path, const struct stat *st, int flag,
                                  struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int fake_tree_setup(void **state) {
    (void)state;
    snprintf(root, sizeof root, "%s/" ZB_FAKE_TREE_NAME "_XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(root) ? 0 : -1;
}

static int fake_tree_teardown(void **state) {
    (void)state;
    return nftw(root, fake_tree_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif

/*
 * test_pause.c - tags, pause and resume through the C ABI: regions per
 * thread (nesting, errors), contents with SYMMEM_REGION_BACKUP kept across
 * cycles at the same addresses, zero without, the paused_bytes statistic,
 * and the defined results of every misuse.
 */
#include "check.h"

#define MiB ((size_t)1 << 20)

static int64_t stat_of(const char *key) {
  symmem_stat st[160];
  size_t n = symmem_stats(0, st, 160);
  for (size_t i = 0; i < n && i < 160; i++)
    if (!strcmp(st[i].key, key)) return st[i].value;
  return -1;
}

static void *region_thread(void *arg) {
  (void)arg;
  /* A region is per thread: this thread has none open. */
  CHECK_RESULT(symmem_region_end(), SYMMEM_ERROR_INVALID_STATE,
               "symmem_region_end on a thread with no region");
  void *p = symmem_alloc(4096, 0, NULL);
  symmem_pointer_info info;
  CHECK_RESULT(symmem_pointer_get_info(p, &info), SYMMEM_SUCCESS, "info of the other thread's block");
  return p;
}

static void test_regions(void) {
  CHECK_RESULT(symmem_region_begin(NULL, 0), SYMMEM_ERROR_INVALID_ARGUMENT, "a NULL tag");
  CHECK_RESULT(symmem_region_begin("a b", 0), SYMMEM_ERROR_INVALID_ARGUMENT, "a tag with a space");
  CHECK_RESULT(symmem_region_begin("c-weights", 8), SYMMEM_ERROR_INVALID_ARGUMENT, "unknown flags");
  CHECK_RESULT(symmem_region_end(), SYMMEM_ERROR_INVALID_STATE, "end without begin");

  CHECK_RESULT(symmem_region_begin("c-weights", SYMMEM_REGION_BACKUP), SYMMEM_SUCCESS, "begin c-weights");
  void *w = symmem_alloc(3 * MiB, 0, NULL);
  pthread_t th;
  void *other = NULL;
  pthread_create(&th, NULL, region_thread, NULL);
  pthread_join(th, &other);
  CHECK_RESULT(symmem_region_begin("c-kv", 0), SYMMEM_SUCCESS, "a nested region");
  void *kv = symmem_alloc(3 * MiB, 0, NULL);
  CHECK_RESULT(symmem_region_end(), SYMMEM_SUCCESS, "end c-kv");
  void *w2 = symmem_alloc(1000, 0, NULL);
  CHECK_RESULT(symmem_region_end(), SYMMEM_SUCCESS, "end c-weights");
  CHECK_RESULT(symmem_region_begin("c-weights", 0), SYMMEM_ERROR_INVALID_ARGUMENT,
               "a tag's regions must ask for the same backup");
  CHECK(w && kv && w2 && other, "allocations in regions succeed");

  memset(w, 0x5a, 3 * MiB);
  memset(w2, 0x33, 1000);
  memset(kv, 0x77, 3 * MiB);
  int64_t reserved = stat_of("reserved_bytes.all.current");
  CHECK_RESULT(symmem_pause("c-weights"), SYMMEM_SUCCESS, "pause c-weights");
  CHECK(stat_of("paused_bytes.all.current") > 0, "paused_bytes counts the tag");
  CHECK_EQ(stat_of("reserved_bytes.all.current"), reserved - stat_of("paused_bytes.all.current"),
           "reserved bytes drop by the paused bytes");
  CHECK_RESULT(symmem_pause("c-weights"), SYMMEM_ERROR_INVALID_STATE, "pause a paused tag");
  CHECK_RESULT(symmem_resume("c-kv"), SYMMEM_ERROR_INVALID_STATE, "resume a live tag");
  CHECK_RESULT(symmem_pause("c-never-opened"), SYMMEM_ERROR_INVALID_ARGUMENT, "pause an unknown tag");
  CHECK_RESULT(symmem_region_begin("c-weights", SYMMEM_REGION_BACKUP), SYMMEM_SUCCESS, "begin c-weights while paused");
  CHECK(symmem_alloc(100, 0, NULL) == NULL, "allocating in a paused tag returns NULL");
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_STATE, "allocating in a paused tag");
  CHECK_RESULT(symmem_region_end(), SYMMEM_SUCCESS, "end");
  CHECK_RESULT(symmem_empty_cache(0), SYMMEM_SUCCESS, "empty_cache during a pause");
  CHECK(stat_of("paused_bytes.all.current") > 0, "empty_cache leaves paused segments");

  /* The memory limit makes the resume run out: nothing is mapped, retry works. */
  CHECK_RESULT(symmem_set_memory_limit(0, (size_t)reserved - 2 * MiB), SYMMEM_SUCCESS, "a tight limit");
  CHECK_RESULT(symmem_resume("c-weights"), SYMMEM_ERROR_OUT_OF_MEMORY, "resume over the limit");
  CHECK(strstr(symmem_last_error_message(), "c-weights") != NULL, "the error names the tag");
  CHECK_RESULT(symmem_set_memory_limit(0, 0), SYMMEM_SUCCESS, "no limit");

  for (int cycle = 0; cycle < 100; cycle++) {
    if (cycle > 0) CHECK_RESULT(symmem_pause(NULL), SYMMEM_SUCCESS, "pause every tag (cycle %d)", cycle);
    CHECK_RESULT(symmem_resume(NULL), SYMMEM_SUCCESS, "resume every tag (cycle %d)", cycle);
    CHECK(((unsigned char *)w)[0] == 0x5a && ((unsigned char *)w)[3 * MiB - 1] == 0x5a &&
              ((unsigned char *)w2)[999] == 0x33,
          "cycle %d: the backup came back at the same addresses", cycle);
    if (cycle > 0)
      CHECK(((unsigned char *)kv)[0] == 0 && ((unsigned char *)kv)[3 * MiB - 1] == 0,
            "cycle %d: c-kv, without backup, reads zero", cycle);
  }
  CHECK_EQ(stat_of("paused_bytes.all.current"), 0, "nothing paused after resume");
  CHECK_RESULT(symmem_pause("c-kv"), SYMMEM_SUCCESS, "pause c-kv");
  symmem_clear_last_error();
  symmem_free(kv, 3 * MiB, 0, NULL);
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "freeing a paused block is allowed");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "the allocator is consistent");
  CHECK_RESULT(symmem_resume("c-kv"), SYMMEM_SUCCESS, "resume c-kv");
  symmem_free(w, 0, 0, NULL);
  symmem_free(w2, 0, 0, NULL);
  symmem_free(other, 0, 0, NULL);
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "the allocator is consistent");
  /* Releasing the idle segments frees their host backups too. */
  CHECK_RESULT(symmem_empty_cache(-1), SYMMEM_SUCCESS, "empty_cache after the cycles");
  CHECK_EQ(stat_of("segment.all.current"), 0, "every segment released");
}

/* An empty tag is never "every tag" (that is NULL): an unset string in a
 * caller's configuration must not pause every tag. Each entry point refuses
 * it, and nothing is paused. */
static void test_empty_tag(void) {
  CHECK_RESULT(symmem_region_begin("c-empty-live", 0), SYMMEM_SUCCESS, "begin c-empty-live");
  unsigned char *p = symmem_alloc(4096, 0, NULL);
  CHECK_RESULT(symmem_region_end(), SYMMEM_SUCCESS, "end c-empty-live");
  CHECK(p != NULL, "an allocation in c-empty-live");
  memset(p, 0x42, 4096);
  CHECK_RESULT(symmem_region_begin("", 0), SYMMEM_ERROR_INVALID_ARGUMENT, "symmem_region_begin(\"\")");
  CHECK_RESULT(symmem_pause(""), SYMMEM_ERROR_INVALID_ARGUMENT, "symmem_pause(\"\")");
  CHECK(strstr(symmem_last_error_message(), "empty") != NULL, "the error says the tag is empty: %s",
        symmem_last_error_message());
  CHECK_EQ(stat_of("paused_bytes.all.current"), 0, "symmem_pause(\"\") paused nothing");
  CHECK_RESULT(symmem_resume(""), SYMMEM_ERROR_INVALID_ARGUMENT, "symmem_resume(\"\")");
  symmem_group *g = NULL;
  CHECK_RESULT(symmem_group_create("c-empty-tag", 0, 1, 0, 10000, &g), SYMMEM_SUCCESS, "a group of one");
  CHECK_RESULT(symmem_pause_group(g, ""), SYMMEM_ERROR_INVALID_ARGUMENT, "symmem_pause_group(g, \"\")");
  CHECK(strstr(symmem_last_error_message(), "empty") != NULL, "the group error says the tag is empty");
  CHECK_RESULT(symmem_resume_group(g, ""), SYMMEM_ERROR_INVALID_ARGUMENT, "symmem_resume_group(g, \"\")");
  CHECK_EQ(stat_of("paused_bytes.all.current"), 0, "nothing was paused");
  CHECK(p[0] == 0x42 && p[4095] == 0x42, "the live tag kept its contents");
  CHECK_RESULT(symmem_group_destroy(g), SYMMEM_SUCCESS, "destroy the group");
  symmem_free(p, 0, 0, NULL);
}

/* Pageable backups, per-pause overrides and the host copy's address. */
static void test_backup_choices(void) {
  CHECK_RESULT(symmem_region_begin("c-pageable", SYMMEM_REGION_BACKUP_PAGEABLE), SYMMEM_ERROR_INVALID_ARGUMENT,
               "PAGEABLE without BACKUP");
  CHECK_RESULT(symmem_region_begin("c-pageable", SYMMEM_REGION_BACKUP | SYMMEM_REGION_BACKUP_PAGEABLE),
               SYMMEM_SUCCESS, "a region with a pageable backup");
  unsigned char *pg = symmem_alloc(MiB, 0, NULL);
  CHECK_RESULT(symmem_region_end(), SYMMEM_SUCCESS, "end c-pageable");
  CHECK_RESULT(symmem_region_begin("c-pageable", SYMMEM_REGION_BACKUP), SYMMEM_ERROR_INVALID_ARGUMENT,
               "pinned after pageable: a tag's backup is fixed");
  CHECK_RESULT(symmem_region_begin("c-nobackup", 0), SYMMEM_SUCCESS, "a region without backup");
  unsigned char *nb = symmem_alloc(MiB, 0, NULL);
  CHECK_RESULT(symmem_region_end(), SYMMEM_SUCCESS, "end c-nobackup");
  CHECK(pg && nb, "allocations");
  memset(pg, 0x61, MiB);
  memset(nb, 0x62, MiB);

  void *host = (void *)1;
  int paused = -1;
  CHECK_RESULT(symmem_backup_pointer(pg, 16, &host, &paused), SYMMEM_ERROR_INVALID_STATE, "no copy before a pause");
  CHECK(host == NULL, "*host is NULL on failure");
  CHECK_RESULT(symmem_backup_pointer(pg, 16, NULL, NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "a NULL host");
  int local = 0;
  CHECK_RESULT(symmem_backup_pointer(&local, 4, &host, NULL), SYMMEM_ERROR_INVALID_POINTER, "memory not from libsymmem");
  CHECK_RESULT(symmem_pause_with("c-pageable", 3), SYMMEM_ERROR_INVALID_ARGUMENT, "DISCARD and KEEP together");
  CHECK_RESULT(symmem_pause_with("c-pageable", 8), SYMMEM_ERROR_INVALID_ARGUMENT, "unknown pause flags");
  CHECK_RESULT(symmem_pause_with("", 0), SYMMEM_ERROR_INVALID_ARGUMENT, "symmem_pause_with(\"\")");

  CHECK_RESULT(symmem_pause("c-pageable"), SYMMEM_SUCCESS, "pause c-pageable");
  CHECK_RESULT(symmem_backup_pointer(pg + 10, 100, &host, &paused), SYMMEM_SUCCESS, "the copy of a paused block");
  CHECK(paused == 1 && ((unsigned char *)host)[0] == 0x61 && ((unsigned char *)host)[99] == 0x61,
        "the copy holds the contents, and the segment is paused");
  CHECK_RESULT(symmem_pause_with("c-nobackup", SYMMEM_PAUSE_KEEP), SYMMEM_SUCCESS, "pause c-nobackup, keeping a copy");
  CHECK_RESULT(symmem_backup_pointer(nb, MiB, &host, NULL), SYMMEM_SUCCESS, "the kept copy");
  CHECK(((unsigned char *)host)[MiB - 1] == 0x62, "the kept copy holds the contents");
  CHECK_RESULT(symmem_resume("c-nobackup"), SYMMEM_SUCCESS, "resume c-nobackup");
  CHECK_RESULT(symmem_resume("c-pageable"), SYMMEM_SUCCESS, "resume c-pageable");
  CHECK(pg[0] == 0x61 && pg[MiB - 1] == 0x61, "the pageable copy came back");
  CHECK(nb[0] == 0x62 && nb[MiB - 1] == 0x62, "the kept copy came back");
  CHECK_RESULT(symmem_backup_pointer(pg, 16, &host, &paused), SYMMEM_SUCCESS, "the copy stays after a resume");
  CHECK(paused == 0, "the segment is live");

  CHECK_RESULT(symmem_pause_with("c-pageable", SYMMEM_PAUSE_DISCARD), SYMMEM_SUCCESS, "pause c-pageable, discarding");
  CHECK_RESULT(symmem_backup_pointer(pg, 16, &host, &paused), SYMMEM_ERROR_INVALID_STATE, "no copy after a discard");
  CHECK(strstr(symmem_last_error_message(), "discarded") != NULL, "the error says why: %s", symmem_last_error_message());
  CHECK_RESULT(symmem_resume_with("c-pageable", 8), SYMMEM_ERROR_INVALID_ARGUMENT, "unknown resume flags");
  CHECK_RESULT(symmem_resume_with("", 0), SYMMEM_ERROR_INVALID_ARGUMENT, "symmem_resume_with(\"\")");
  CHECK_RESULT(symmem_resume("c-pageable"), SYMMEM_SUCCESS, "resume c-pageable");
  CHECK(pg[0] == 0 && pg[MiB - 1] == 0, "discarded: zero after the resume");
  CHECK_RESULT(symmem_pause("c-pageable"), SYMMEM_SUCCESS, "pause c-pageable again");
  CHECK_RESULT(symmem_resume_with("c-pageable", SYMMEM_RESUME_NO_FILL), SYMMEM_SUCCESS, "resume without fill");
  CHECK(pg[0] == 0 && pg[MiB - 1] == 0, "the copy is restored whatever the flag");

  /* What a resume does with the host copies: retain them at their address,
   * or give them back. */
  memset(pg, 0x63, MiB);
  CHECK_RESULT(symmem_pause("c-pageable"), SYMMEM_SUCCESS, "pause c-pageable");
  void *first = NULL;
  CHECK_RESULT(symmem_backup_pointer(pg, 16, &first, NULL), SYMMEM_SUCCESS, "the copy of the pause");
  CHECK_RESULT(symmem_resume_with("c-pageable", SYMMEM_RESUME_RELEASE_BACKUP | SYMMEM_RESUME_RETAIN_BACKUP),
               SYMMEM_ERROR_INVALID_ARGUMENT, "RELEASE_BACKUP and RETAIN_BACKUP together");
  CHECK_RESULT(symmem_resume_with("c-pageable", SYMMEM_RESUME_RETAIN_BACKUP), SYMMEM_SUCCESS, "resume, retaining the copy");
  CHECK_RESULT(symmem_backup_pointer(pg, 16, &host, &paused), SYMMEM_SUCCESS, "the retained copy");
  CHECK(host == first && paused == 0, "retained at the same address");
  CHECK_RESULT(symmem_pause("c-pageable"), SYMMEM_SUCCESS, "pause c-pageable");
  CHECK_RESULT(symmem_backup_pointer(pg, 16, &host, NULL), SYMMEM_SUCCESS, "the copy of the pause");
  CHECK(host == first, "the next pause saves into the retained copy");
  CHECK_RESULT(symmem_resume_with("c-pageable", SYMMEM_RESUME_RELEASE_BACKUP | SYMMEM_RESUME_NO_FILL), SYMMEM_SUCCESS,
               "resume, releasing the copy");
  CHECK(pg[0] == 0x63 && pg[MiB - 1] == 0x63, "restored before the release");
  CHECK_RESULT(symmem_backup_pointer(pg, 16, &host, &paused), SYMMEM_ERROR_INVALID_STATE, "released: no copy");
  symmem_free(pg, 0, 0, NULL);
  symmem_free(nb, 0, 0, NULL);
  CHECK_RESULT(symmem_empty_cache(-1), SYMMEM_SUCCESS, "empty_cache frees the host copies with their segments");

  /* Disk backups: an unlinked file of the backup directory. */
  CHECK_RESULT(symmem_set_backup_dir(""), SYMMEM_ERROR_INVALID_ARGUMENT, "an empty backup directory");
  char dir[] = "/tmp/symmem-c-backup-XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "a scratch directory");
  CHECK_RESULT(symmem_set_backup_dir(dir), SYMMEM_SUCCESS, "set the backup directory");
  CHECK_RESULT(symmem_region_begin("c-disk", SYMMEM_REGION_BACKUP_DISK), SYMMEM_ERROR_INVALID_ARGUMENT, "DISK without BACKUP");
  CHECK_RESULT(symmem_region_begin("c-disk", SYMMEM_REGION_BACKUP | SYMMEM_REGION_BACKUP_DISK | SYMMEM_REGION_BACKUP_PAGEABLE),
               SYMMEM_ERROR_INVALID_ARGUMENT, "DISK and PAGEABLE");
  CHECK_RESULT(symmem_region_begin("c-disk", SYMMEM_REGION_BACKUP | SYMMEM_REGION_BACKUP_DISK), SYMMEM_SUCCESS, "a disk region");
  unsigned char *dk = symmem_alloc(2 * MiB, 0, NULL);
  CHECK_RESULT(symmem_region_end(), SYMMEM_SUCCESS, "end c-disk");
  CHECK(dk != NULL, "an allocation");
  memset(dk, 0x44, 2 * MiB);
  CHECK_RESULT(symmem_pause("c-disk"), SYMMEM_SUCCESS, "pause c-disk");
  CHECK(rmdir(dir) == 0, "the backup file is unlinked: the directory is empty");
  CHECK_RESULT(symmem_resume("c-disk"), SYMMEM_SUCCESS, "resume c-disk");
  CHECK(dk[0] == 0x44 && dk[2 * MiB - 1] == 0x44, "the disk copy came back");
  CHECK_RESULT(symmem_set_backup_dir(NULL), SYMMEM_SUCCESS, "back to the default directory");
  symmem_free(dk, 0, 0, NULL);
  CHECK_RESULT(symmem_empty_cache(-1), SYMMEM_SUCCESS, "empty_cache");

  /* The default tag and untagged regions. */
  CHECK_RESULT(symmem_region_begin("c-x", SYMMEM_REGION_UNTAGGED), SYMMEM_ERROR_INVALID_ARGUMENT, "UNTAGGED with a tag");
  CHECK_RESULT(symmem_region_begin(NULL, SYMMEM_REGION_UNTAGGED | SYMMEM_REGION_BACKUP), SYMMEM_ERROR_INVALID_ARGUMENT,
               "UNTAGGED with another flag");
  CHECK_RESULT(symmem_set_default_tag("", 0), SYMMEM_ERROR_INVALID_ARGUMENT, "an empty default tag");
  CHECK_RESULT(symmem_set_default_tag(NULL, SYMMEM_REGION_BACKUP), SYMMEM_ERROR_INVALID_ARGUMENT, "flags without a tag");
  CHECK_RESULT(symmem_set_default_tag("c-default", SYMMEM_REGION_BACKUP), SYMMEM_SUCCESS, "a default tag");
  unsigned char *d = symmem_alloc(512, 0, NULL);
  CHECK_RESULT(symmem_region_begin(NULL, SYMMEM_REGION_UNTAGGED), SYMMEM_SUCCESS, "an untagged region");
  unsigned char *u = symmem_alloc(512, 0, NULL);
  CHECK_RESULT(symmem_region_end(), SYMMEM_SUCCESS, "end the untagged region");
  CHECK_RESULT(symmem_set_default_tag(NULL, 0), SYMMEM_SUCCESS, "no default tag");
  CHECK(d && u, "allocations");
  memset(d, 0x71, 512);
  memset(u, 0x72, 512);
  CHECK_RESULT(symmem_pause("c-default"), SYMMEM_SUCCESS, "pause the default tag");
  CHECK(u[0] == 0x72, "the untagged block stays");
  CHECK_RESULT(symmem_backup_pointer(d, 512, &host, &paused), SYMMEM_SUCCESS, "the default tag's copy");
  CHECK(paused == 1 && ((unsigned char *)host)[511] == 0x71, "the default tag's block was paused with its copy");
  CHECK_RESULT(symmem_resume("c-default"), SYMMEM_SUCCESS, "resume the default tag");
  CHECK(d[0] == 0x71, "restored");
  symmem_free(d, 0, 0, NULL);
  symmem_free(u, 0, 0, NULL);
  CHECK_RESULT(symmem_empty_cache(-1), SYMMEM_SUCCESS, "empty_cache");
}

/* SYMMEM_REGION_OWN_DEVICE: a property of the tag like its backup; the
 * memory pauses and resumes with its contents. */
static void test_own_device(void) {
  CHECK_RESULT(symmem_region_begin("c-own", SYMMEM_REGION_OWN_DEVICE | SYMMEM_REGION_BACKUP), SYMMEM_SUCCESS,
               "a region mapped for its own device, with backup");
  unsigned char *p = symmem_alloc(MiB, 0, NULL);
  CHECK_RESULT(symmem_region_end(), SYMMEM_SUCCESS, "end c-own");
  CHECK(p != NULL, "allocation in c-own");
  CHECK_RESULT(symmem_region_begin("c-own", SYMMEM_REGION_BACKUP), SYMMEM_ERROR_INVALID_ARGUMENT,
               "the same tag without OWN_DEVICE");
  CHECK(strstr(symmem_last_error_message(), "own-device") != NULL, "the error names the flag: %s",
        symmem_last_error_message());
  CHECK_RESULT(symmem_region_begin("c-own-bad", 32), SYMMEM_ERROR_INVALID_ARGUMENT, "unknown flags");
  CHECK_RESULT(symmem_region_begin(NULL, SYMMEM_REGION_UNTAGGED | SYMMEM_REGION_OWN_DEVICE),
               SYMMEM_ERROR_INVALID_ARGUMENT, "OWN_DEVICE on an untagged region");
  if (!p)
    return;
  memset(p, 0x77, MiB);
  CHECK_RESULT(symmem_pause("c-own"), SYMMEM_SUCCESS, "pause c-own");
  CHECK_RESULT(symmem_resume("c-own"), SYMMEM_SUCCESS, "resume c-own");
  CHECK(p[0] == 0x77 && p[MiB - 1] == 0x77, "c-own's contents came back");
  symmem_free(p, 0, 0, NULL);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  symmem_clear_last_error();
  const char *libcuda = getenv("SYMMEM_LIBCUDA");
  if (strcmp(symmem_backend_name(), "host") && !(libcuda && strstr(libcuda, "fake"))) {
    check_skip("the C pause test touches memory with the CPU: host backend and fake driver only (python/tests/gpu covers GPUs)");
    return check_summary();
  }
  test_regions();
  test_empty_tag();
  test_backup_choices();
  test_own_device();
  return check_summary();
}

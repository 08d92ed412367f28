/*
 * store.c: gpcd's memory across restarts: SQLite in WAL mode with
 * synchronous=FULL, holding jobs, every state change, GPU samples (pruned to
 * a retention window) and alerts.
 *
 * A submission is acknowledged only after its transaction is on disk. One
 * fsync per submission would cap gpcd at the disk's fsync rate, so
 * submissions that arrive together share one transaction (group commit): the
 * first waiting thread becomes the leader, commits every pending submission
 * at once and wakes the others. A crash before the commit loses only jobs
 * that were never acknowledged; after it, all of them are on disk.
 */
#include "gpc/sched.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STORE_SCHEMA_VERSION 2

typedef struct submit_request {
    gpcd_job *job;
    gpc_status status;
    int done;
    struct submit_request *next;
} submit_request;

struct gpcd_store {
    sqlite3 *db;
    pthread_mutex_t db_lock; /* one connection, used by one thread at a time */
    pthread_mutex_t commit_lock;
    pthread_cond_t commit_done;
    submit_request *pending_head, *pending_tail;
    int committing;
    sqlite3_stmt *insert_job, *insert_event, *update_job, *get_job;
    char path[1024];
    int simulate_full; /* tests: writes fail as SQLITE_FULL would */
};

static const char *schema =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);"
    /* state is the gpcd_state code: 0 queued, 1 running, 2 completed,
     * 3 failed, 4 cancelled, 5 preempted (job_events has the names) */
    "CREATE TABLE IF NOT EXISTS jobs("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, owner_uid INTEGER NOT NULL, owner TEXT,"
    " name TEXT, command TEXT NOT NULL, cwd TEXT, env TEXT, data TEXT,"
    " gpus INTEGER NOT NULL, mem INTEGER NOT NULL, priority INTEGER NOT NULL,"
    " type INTEGER NOT NULL, time_limit REAL NOT NULL, state INTEGER NOT NULL,"
    " submit_time REAL NOT NULL, start_time REAL, end_time REAL, exit_code INTEGER,"
    " signal INTEGER, assigned TEXT, pid INTEGER, pid_start INTEGER, pgid INTEGER,"
    " preemptions INTEGER NOT NULL DEFAULT 0, message TEXT,"
    " gpus_min INTEGER NOT NULL DEFAULT 0, gpus_max INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);"
    "CREATE INDEX IF NOT EXISTS jobs_end ON jobs(end_time);" /* the jobs that ended last */
    "CREATE TABLE IF NOT EXISTS job_events("
    " job_id INTEGER NOT NULL, time REAL NOT NULL, state TEXT NOT NULL, message TEXT);"
    "CREATE INDEX IF NOT EXISTS job_events_job ON job_events(job_id);"
    "CREATE TABLE IF NOT EXISTS gpu_samples("
    " time REAL NOT NULL, gpu INTEGER NOT NULL, util REAL, mem_used INTEGER,"
    " mem_total INTEGER, temperature REAL, power REAL);"
    "CREATE INDEX IF NOT EXISTS gpu_samples_time ON gpu_samples(time);"
    "CREATE TABLE IF NOT EXISTS alerts("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, gpu INTEGER, kind TEXT NOT NULL,"
    " message TEXT, start_time REAL NOT NULL, end_time REAL);";

#define JOB_COLUMNS                                                                                \
    "id, owner_uid, owner, name, command, cwd, env, data, gpus, mem, priority, type,"              \
    " time_limit, state, submit_time, start_time, end_time, exit_code, signal, assigned, pid,"     \
    " pid_start, pgid, preemptions, message, gpus_min, gpus_max"

static gpc_status store_fail(gpcd_store *store, const char *what) {
    return gpc_error(GPC_ERR_IO, "job database %s: %s failed: %s (check the disk and permissions)",
                     store->path, what, sqlite3_errmsg(store->db));
}

static gpc_status exec_sql(gpcd_store *store, const char *sql) {
    char *err = NULL;
    if (store->simulate_full && strncmp(sql, "BEGIN", 5) == 0)
        return gpc_error(GPC_ERR_IO, "job database %s: database or disk is full (simulated)",
                         store->path);
    if (sqlite3_exec(store->db, sql, NULL, NULL, &err) != SQLITE_OK) {
        gpc_status st = gpc_error(GPC_ERR_IO, "job database %s: %s (running %.40s...)", store->path,
                                  err ? err : "error", sql);
        sqlite3_free(err);
        return st;
    }
    return GPC_OK;
}

/* Ends the transaction begun under db_lock: COMMIT when st is GPC_OK;
 * otherwise ROLLBACK when one is open, keeping st's message rather than
 * the rollback's. Returns the outcome. */
static gpc_status end_transaction(gpcd_store *store, gpc_status st) {
    if (st == GPC_OK) st = exec_sql(store, "COMMIT");
    if (st != GPC_OK && sqlite3_get_autocommit(store->db) == 0) {
        char message[1024];
        snprintf(message, sizeof message, "%s", gpc_last_error());
        exec_sql(store, "ROLLBACK");
        gpc_error(st, "%s", message);
    }
    return st;
}

static gpc_status prepare(gpcd_store *store, const char *sql, sqlite3_stmt **out) {
    if (sqlite3_prepare_v2(store->db, sql, -1, out, NULL) != SQLITE_OK)
        return store_fail(store, "preparing a statement");
    return GPC_OK;
}

static gpc_status owner_only(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || fchmod(fd, 0600) != 0) {
        gpc_status st =
            gpc_error(GPC_ERR_IO, "cannot open job database %s (creating it owner-only): %s", path,
                      strerror(errno));
        if (fd >= 0) close(fd);
        return st;
    }
    close(fd);
    static const char *const suffixes[] = {"-wal", "-shm", "-journal"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        char side[1100];
        snprintf(side, sizeof side, "%s%s", path, suffixes[i]);
        if (chmod(side, 0600) != 0 && errno != ENOENT)
            return gpc_error(GPC_ERR_IO, "cannot make %s owner-only: %s", side, strerror(errno));
    }
    return GPC_OK;
}

/* Brings a database an older gpcd wrote up to this schema, in place, so
 * that its jobs keep running and waiting across the upgrade. Version 1
 * lacks the elastic range: its jobs all need a fixed count (0, 0). A new
 * database has no schema_version yet and nothing to do. */
static gpc_status migrate(gpcd_store *store) {
    sqlite3_stmt *s;
    GPC_TRY(prepare(store, "SELECT value FROM meta WHERE key = 'schema_version'", &s));
    int version = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
    sqlite3_finalize(s);
    if (version != 1) return GPC_OK;
    return exec_sql(store, "BEGIN IMMEDIATE;"
                           "ALTER TABLE jobs ADD COLUMN gpus_min INTEGER NOT NULL DEFAULT 0;"
                           "ALTER TABLE jobs ADD COLUMN gpus_max INTEGER NOT NULL DEFAULT 0;"
                           "UPDATE meta SET value = '2' WHERE key = 'schema_version';"
                           "COMMIT;");
}

gpc_status gpcd_store_open(const char *path, gpcd_store **out) {
    *out = NULL;
    gpcd_store *store = calloc(1, sizeof *store);
    if (!store) return gpc_error(GPC_ERR_NOMEM, "out of memory opening the job database");
    snprintf(store->path, sizeof store->path, "%s", path);
    pthread_mutex_init(&store->db_lock, NULL);
    pthread_mutex_init(&store->commit_lock, NULL);
    pthread_cond_init(&store->commit_done, NULL);
    /* The database holds every job's command and environment: owner-only.
     * SQLite gives the WAL and shared-memory files the database's mode, so
     * creating it 0600 covers them; files an older gpcd left are narrowed. */
    gpc_status mode_st = owner_only(path);
    if (mode_st != GPC_OK) {
        gpcd_store_close(store);
        return mode_st;
    }
    if (sqlite3_open_v2(path, &store->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        gpc_status st = gpc_error(GPC_ERR_IO, "cannot open job database %s: %s", path,
                                  store->db ? sqlite3_errmsg(store->db) : "out of memory");
        gpcd_store_close(store);
        return st;
    }
    sqlite3_busy_timeout(store->db, 5000);
    gpc_status st = exec_sql(store, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;");
    if (st == GPC_OK) st = exec_sql(store, schema);
    if (st == GPC_OK) st = migrate(store);
    if (st == GPC_OK) {
        char sql[128];
        snprintf(sql, sizeof sql,
                 "INSERT OR IGNORE INTO meta(key, value) VALUES('schema_version', '%d');",
                 STORE_SCHEMA_VERSION);
        st = exec_sql(store, sql);
    }
    if (st == GPC_OK) {
        sqlite3_stmt *s;
        st = prepare(store, "SELECT value FROM meta WHERE key = 'schema_version'", &s);
        if (st == GPC_OK) {
            int version = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
            sqlite3_finalize(s);
            if (version != STORE_SCHEMA_VERSION)
                st = gpc_error(GPC_ERR_FORMAT,
                               "job database %s has schema version %d; this gpcd reads %d "
                               "(move the file away to start afresh)",
                               path, version, STORE_SCHEMA_VERSION);
        }
    }
    if (st == GPC_OK)
        st = prepare(store,
                     "INSERT INTO jobs(owner_uid, owner, name, command, cwd, env, data, gpus, mem,"
                     " priority, type, time_limit, state, submit_time, exit_code, preemptions,"
                     " gpus_min, gpus_max) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,-1,0,?,?)",
                     &store->insert_job);
    if (st == GPC_OK)
        st = prepare(store, "INSERT INTO job_events(job_id, time, state, message) VALUES(?,?,?,?)",
                     &store->insert_event);
    if (st == GPC_OK)
        st = prepare(store,
                     "UPDATE jobs SET state=?, start_time=?, end_time=?, exit_code=?, signal=?,"
                     " assigned=?, pid=?, pid_start=?, pgid=?, preemptions=?, message=?, gpus=?"
                     " WHERE id=?",
                     &store->update_job);
    if (st == GPC_OK)
        st = prepare(store, "SELECT " JOB_COLUMNS " FROM jobs WHERE id = ?", &store->get_job);
    if (st != GPC_OK) {
        gpcd_store_close(store);
        return st;
    }
    *out = store;
    return GPC_OK;
}

gpc_status gpcd_store_reserve_ids(gpcd_store *store, int64_t above) {
    sqlite3_stmt *s = NULL;
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = exec_sql(store, "BEGIN IMMEDIATE");
    const char *sql[] = {"INSERT INTO sqlite_sequence(name, seq) SELECT 'jobs', ?1 WHERE NOT "
                         "EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'jobs')",
                         "UPDATE sqlite_sequence SET seq = ?1 WHERE name = 'jobs' AND seq < ?1"};
    for (int i = 0; i < 2 && st == GPC_OK; i++) {
        st = prepare(store, sql[i], &s);
        if (st != GPC_OK) break;
        sqlite3_bind_int64(s, 1, above);
        if (sqlite3_step(s) != SQLITE_DONE) st = store_fail(store, "reserving job ids");
        sqlite3_finalize(s);
    }
    st = end_transaction(store, st);
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

gpc_status gpcd_store_meta_get(gpcd_store *store, const char *key, char *value, size_t size) {
    sqlite3_stmt *s;
    value[0] = '\0';
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = prepare(store, "SELECT value FROM meta WHERE key = ?", &s);
    if (st == GPC_OK) {
        sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(s) == SQLITE_ROW && sqlite3_column_text(s, 0))
            snprintf(value, size, "%s", (const char *)sqlite3_column_text(s, 0));
        sqlite3_finalize(s);
    }
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

gpc_status gpcd_store_meta_set(gpcd_store *store, const char *key, const char *value) {
    sqlite3_stmt *s = NULL;
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = exec_sql(store, "BEGIN IMMEDIATE");
    if (st == GPC_OK)
        st = prepare(store, "INSERT OR REPLACE INTO meta(key, value) VALUES(?,?)", &s);
    if (st == GPC_OK) {
        sqlite3_bind_text(s, 1, key, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 2, value, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(s) != SQLITE_DONE) st = store_fail(store, "saving a setting");
    }
    sqlite3_finalize(s);
    st = end_transaction(store, st);
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

void gpcd_store_simulate_full(gpcd_store *store, int on) {
    pthread_mutex_lock(&store->db_lock);
    store->simulate_full = on;
    pthread_mutex_unlock(&store->db_lock);
}

void gpcd_store_close(gpcd_store *store) {
    if (!store) return;
    sqlite3_finalize(store->insert_job);
    sqlite3_finalize(store->insert_event);
    sqlite3_finalize(store->update_job);
    sqlite3_finalize(store->get_job);
    if (store->db) sqlite3_close(store->db);
    pthread_mutex_destroy(&store->db_lock);
    pthread_mutex_destroy(&store->commit_lock);
    pthread_cond_destroy(&store->commit_done);
    free(store);
}

static void bind_text_or_null(sqlite3_stmt *s, int i, const char *text) {
    if (text)
        sqlite3_bind_text(s, i, text, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(s, i);
}

static int insert_event(gpcd_store *store, int64_t id, double time, gpcd_state state,
                        const char *message) {
    sqlite3_stmt *s = store->insert_event;
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_double(s, 2, time);
    sqlite3_bind_text(s, 3, gpcd_state_name(state), -1, SQLITE_STATIC);
    bind_text_or_null(s, 4, message);
    return sqlite3_step(s) == SQLITE_DONE ? 0 : -1;
}

static int insert_job(gpcd_store *store, gpcd_job *job) {
    sqlite3_stmt *s = store->insert_job;
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    sqlite3_bind_int64(s, 1, job->owner_uid);
    bind_text_or_null(s, 2, job->owner);
    bind_text_or_null(s, 3, job->name);
    bind_text_or_null(s, 4, job->command ? job->command : "[]");
    bind_text_or_null(s, 5, job->cwd);
    bind_text_or_null(s, 6, job->env);
    bind_text_or_null(s, 7, job->data);
    sqlite3_bind_int(s, 8, job->gpus);
    sqlite3_bind_int64(s, 9, (sqlite3_int64)job->mem);
    sqlite3_bind_int(s, 10, job->priority);
    sqlite3_bind_int(s, 11, job->type);
    sqlite3_bind_double(s, 12, job->time_limit);
    sqlite3_bind_int(s, 13, job->state);
    sqlite3_bind_double(s, 14, job->submit_time);
    sqlite3_bind_int(s, 15, job->gpus_min);
    sqlite3_bind_int(s, 16, job->gpus_max);
    if (sqlite3_step(s) != SQLITE_DONE) return -1;
    job->id = sqlite3_last_insert_rowid(store->db);
    return insert_event(store, job->id, job->submit_time, job->state, NULL);
}

/* Commits a batch of submissions in one transaction; all or none. */
static void commit_batch(gpcd_store *store, submit_request *batch) {
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = exec_sql(store, "BEGIN IMMEDIATE");
    for (submit_request *r = batch; st == GPC_OK && r; r = r->next)
        if (insert_job(store, r->job) != 0) st = store_fail(store, "inserting a job");
    st = end_transaction(store, st);
    pthread_mutex_unlock(&store->db_lock);
    for (submit_request *r = batch; r; r = r->next) {
        r->status = st;
        if (st != GPC_OK) r->job->id = 0;
    }
}

gpc_status gpcd_store_submit(gpcd_store *store, gpcd_job *job) {
    submit_request request = {job, GPC_OK, 0, NULL};
    pthread_mutex_lock(&store->commit_lock);
    if (store->pending_tail)
        store->pending_tail->next = &request;
    else
        store->pending_head = &request;
    store->pending_tail = &request;
    while (!request.done) {
        if (store->committing) {
            pthread_cond_wait(&store->commit_done, &store->commit_lock);
            continue;
        }
        /* Become the leader: take everything queued so far, ours included. */
        store->committing = 1;
        submit_request *batch = store->pending_head;
        store->pending_head = store->pending_tail = NULL;
        pthread_mutex_unlock(&store->commit_lock);
        commit_batch(store, batch);
        pthread_mutex_lock(&store->commit_lock);
        for (submit_request *r = batch; r;) {
            submit_request *next = r->next; /* r may vanish once done is seen */
            r->done = 1;
            r = next;
        }
        store->committing = 0;
        pthread_cond_broadcast(&store->commit_done);
    }
    pthread_mutex_unlock(&store->commit_lock);
    if (request.status != GPC_OK)
        return gpc_error(request.status,
                         "the job was not saved: job database %s failed a commit "
                         "(see gpcd's log)",
                         store->path);
    return GPC_OK;
}

static void format_assigned(const gpcd_job *job, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < job->assigned_count && used + 8 < size; i++)
        used += (size_t)snprintf(buf + used, size - used, i ? ",%d" : "%d", job->assigned[i]);
}

gpc_status gpcd_store_update(gpcd_store *store, const gpcd_job *job) {
    char assigned[GPCD_MAX_GPUS * 4];
    format_assigned(job, assigned, sizeof assigned);
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = exec_sql(store, "BEGIN IMMEDIATE");
    if (st == GPC_OK) {
        sqlite3_stmt *s = store->update_job;
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
        sqlite3_bind_int(s, 1, job->state);
        sqlite3_bind_double(s, 2, job->start_time);
        sqlite3_bind_double(s, 3, job->end_time);
        sqlite3_bind_int(s, 4, job->exit_code);
        sqlite3_bind_int(s, 5, job->signal);
        sqlite3_bind_text(s, 6, assigned, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 7, job->pid);
        sqlite3_bind_int64(s, 8, (sqlite3_int64)job->pid_start);
        sqlite3_bind_int64(s, 9, job->pgid);
        sqlite3_bind_int(s, 10, job->preemptions);
        bind_text_or_null(s, 11, job->message);
        sqlite3_bind_int(s, 12, job->gpus); /* an elastic job's count changes */
        sqlite3_bind_int64(s, 13, job->id);
        if (sqlite3_step(s) != SQLITE_DONE)
            st = store_fail(store, "updating a job");
        else if (sqlite3_changes(store->db) != 1)
            st = gpc_error(GPC_ERR_INTERNAL, "job %lld is not in the database", (long long)job->id);
    }
    if (st == GPC_OK && insert_event(store, job->id, gpc_wall_seconds(), job->state, job->message))
        st = store_fail(store, "recording a state change");
    st = end_transaction(store, st);
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

static char *column_text(sqlite3_stmt *s, int i) {
    const unsigned char *t = sqlite3_column_text(s, i);
    return t ? strdup((const char *)t) : NULL;
}

static gpcd_job *job_from_row(sqlite3_stmt *s) {
    gpcd_job *job = gpcd_job_new();
    if (!job) return NULL;
    job->id = sqlite3_column_int64(s, 0);
    job->owner_uid = (uint32_t)sqlite3_column_int64(s, 1);
    job->owner = column_text(s, 2);
    job->name = column_text(s, 3);
    job->command = column_text(s, 4);
    job->cwd = column_text(s, 5);
    job->env = column_text(s, 6);
    job->data = column_text(s, 7);
    job->gpus = sqlite3_column_int(s, 8);
    job->mem = (uint64_t)sqlite3_column_int64(s, 9);
    job->priority = sqlite3_column_int(s, 10);
    job->type = (gpcd_job_type)sqlite3_column_int(s, 11);
    job->time_limit = sqlite3_column_double(s, 12);
    job->state = (gpcd_state)sqlite3_column_int(s, 13);
    job->submit_time = sqlite3_column_double(s, 14);
    job->start_time = sqlite3_column_double(s, 15);
    job->end_time = sqlite3_column_double(s, 16);
    job->exit_code = sqlite3_column_type(s, 17) == SQLITE_NULL ? -1 : sqlite3_column_int(s, 17);
    job->signal = sqlite3_column_int(s, 18);
    const unsigned char *assigned = sqlite3_column_text(s, 19);
    job->assigned_count = 0;
    if (assigned && job->state == GPCD_RUNNING) {
        const char *p = (const char *)assigned;
        while (*p && job->assigned_count < GPCD_MAX_GPUS) {
            char *end;
            long g = strtol(p, &end, 10);
            if (end == p) break;
            job->assigned[job->assigned_count++] = (int)g;
            p = *end == ',' ? end + 1 : end;
        }
    }
    job->pid = (pid_t)sqlite3_column_int64(s, 20);
    job->pid_start = (uint64_t)sqlite3_column_int64(s, 21);
    job->pgid = (pid_t)sqlite3_column_int64(s, 22);
    job->preemptions = sqlite3_column_int(s, 23);
    job->message = column_text(s, 24);
    job->gpus_min = sqlite3_column_int(s, 25);
    job->gpus_max = sqlite3_column_int(s, 26);
    job->data_hash = gpcd_data_hash(job->data);
    if ((unsigned)job->state >= GPCD_STATE_COUNT) job->state = GPCD_FAILED;
    if ((unsigned)job->type >= GPCD_TYPE_COUNT) job->type = GPCD_TYPE_BATCH;
    return job;
}

gpc_status gpcd_store_get(gpcd_store *store, int64_t id, gpcd_job **out) {
    *out = NULL;
    pthread_mutex_lock(&store->db_lock);
    sqlite3_stmt *s = store->get_job;
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, id);
    int rc = sqlite3_step(s);
    gpc_status st = GPC_OK;
    if (rc == SQLITE_ROW)
        *out = job_from_row(s);
    else if (rc == SQLITE_DONE)
        st = gpc_error(GPC_ERR_INVALID_ARG, "no job %lld", (long long)id);
    else
        st = store_fail(store, "reading a job");
    sqlite3_reset(s);
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

/* Runs a job query whose ?1 is the state mask and ?2 a number (its meaning is
 * the query's), collecting the rows. */
static gpc_status list_query(gpcd_store *store, const char *sql, unsigned state_mask, double number,
                             gpcd_job ***out, int *count) {
    *out = NULL;
    *count = 0;
    sqlite3_stmt *s;
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = prepare(store, sql, &s);
    if (st != GPC_OK) {
        pthread_mutex_unlock(&store->db_lock);
        return st;
    }
    sqlite3_bind_int64(s, 1, state_mask);
    sqlite3_bind_double(s, 2, number);
    int capacity = 64, n = 0, oom = 0;
    gpcd_job **jobs = malloc((size_t)capacity * sizeof *jobs);
    int rc = SQLITE_DONE;
    oom = jobs == NULL;
    while (!oom && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == capacity) {
            gpcd_job **grown = realloc(jobs, (size_t)capacity * 2 * sizeof *jobs);
            if (!grown) {
                oom = 1;
                break;
            }
            jobs = grown;
            capacity *= 2;
        }
        jobs[n] = job_from_row(s);
        if (!jobs[n]) {
            oom = 1;
            break;
        }
        n++;
    }
    if (oom)
        st = gpc_error(GPC_ERR_NOMEM, "out of memory listing jobs");
    else if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        st = store_fail(store, "listing jobs");
    sqlite3_finalize(s);
    pthread_mutex_unlock(&store->db_lock);
    if (st != GPC_OK) {
        gpcd_store_free_list(jobs, n);
        return st;
    }
    *out = jobs;
    *count = n;
    return GPC_OK;
}

/* The SQL condition for the states of mask: "state IN (0, 1, 5)", or "1"
 * when it has them all. An IN list, not a bit test on each row: SQLite
 * answers it through jobs_state, where the test read every job ever run,
 * environment and all (0.2 s a `gpc queue` at 200,000 jobs). */
static void state_filter(unsigned mask, char *buf, size_t size) {
    const unsigned all = (1u << GPCD_STATE_COUNT) - 1;
    if ((mask & all) == all) {
        snprintf(buf, size, "1");
        return;
    }
    size_t len = (size_t)snprintf(buf, size, "state IN (");
    for (int st = 0; st < GPCD_STATE_COUNT; st++)
        if (mask & (1u << st))
            len += (size_t)snprintf(buf + len, size - len, "%s%d", buf[len - 1] == '(' ? "" : ", ",
                                    st);
    snprintf(buf + len, size - len, ")");
}

gpc_status gpcd_store_list(gpcd_store *store, unsigned state_mask, double since_end,
                           gpcd_job ***out, int *count) {
    char states[64];
    state_filter(state_mask, states, sizeof states);
    char sql[1024];
    snprintf(sql, sizeof sql,
             "SELECT " JOB_COLUMNS " FROM jobs WHERE %s"
             " AND (?2 = 0 OR state IN (0, 1, 5) OR end_time >= ?2) ORDER BY id",
             states);
    return list_query(store, sql, state_mask, since_end, out, count);
}

gpc_status gpcd_store_list_recent(gpcd_store *store, unsigned state_mask, int newest,
                                  gpcd_job ***out, int *count) {
    return list_query(store,
                      "SELECT " JOB_COLUMNS " FROM jobs WHERE ((1 << state) & ?1) != 0"
                      " ORDER BY end_time DESC, id DESC LIMIT ?2",
                      state_mask, newest, out, count);
}

void gpcd_store_free_list(gpcd_job **jobs, int count) {
    if (!jobs) return;
    for (int i = 0; i < count; i++)
        gpcd_job_free(jobs[i]);
    free(jobs);
}

gpc_status gpcd_store_events(gpcd_store *store, int64_t id, char **json_out) {
    *json_out = NULL;
    sqlite3_stmt *s;
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = prepare(store,
                            "SELECT time, state, message FROM job_events WHERE job_id = ?"
                            " ORDER BY rowid",
                            &s);
    if (st == GPC_OK) {
        json_t *events = json_array();
        sqlite3_bind_int64(s, 1, id);
        while (sqlite3_step(s) == SQLITE_ROW) {
            json_t *e = json_object();
            json_object_set_new(e, "time", json_real(sqlite3_column_double(s, 0)));
            json_object_set_new(e, "state", json_string((const char *)sqlite3_column_text(s, 1)));
            const unsigned char *m = sqlite3_column_text(s, 2);
            json_object_set_new(e, "message", m ? json_string((const char *)m) : json_null());
            json_array_append_new(events, e);
        }
        sqlite3_finalize(s);
        *json_out = json_dumps(events, JSON_COMPACT);
        json_decref(events);
    }
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

gpc_status gpcd_store_add_samples(gpcd_store *store, const gpcd_sample_row *rows, int count,
                                  double retention, double now) {
    sqlite3_stmt *s = NULL, *prune = NULL;
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = exec_sql(store, "BEGIN");
    if (st == GPC_OK)
        st = prepare(store,
                     "INSERT INTO gpu_samples(time, gpu, util, mem_used, mem_total, temperature,"
                     " power) VALUES(?,?,?,?,?,?,?)",
                     &s);
    for (int i = 0; st == GPC_OK && i < count; i++) {
        sqlite3_reset(s);
        sqlite3_bind_double(s, 1, rows[i].time);
        sqlite3_bind_int(s, 2, rows[i].gpu);
        sqlite3_bind_double(s, 3, rows[i].util);
        sqlite3_bind_int64(s, 4, (sqlite3_int64)rows[i].mem_used);
        sqlite3_bind_int64(s, 5, (sqlite3_int64)rows[i].mem_total);
        sqlite3_bind_double(s, 6, rows[i].temperature);
        sqlite3_bind_double(s, 7, rows[i].power);
        if (sqlite3_step(s) != SQLITE_DONE) st = store_fail(store, "saving GPU samples");
    }
    if (st == GPC_OK) st = prepare(store, "DELETE FROM gpu_samples WHERE time < ?", &prune);
    if (st == GPC_OK) {
        sqlite3_bind_double(prune, 1, now - retention);
        if (sqlite3_step(prune) != SQLITE_DONE) st = store_fail(store, "pruning GPU samples");
    }
    sqlite3_finalize(s);
    sqlite3_finalize(prune);
    st = end_transaction(store, st);
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

gpc_status gpcd_store_count_samples(gpcd_store *store, int64_t *out) {
    sqlite3_stmt *s;
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = prepare(store, "SELECT COUNT(*) FROM gpu_samples", &s);
    if (st == GPC_OK) {
        *out = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int64(s, 0) : -1;
        sqlite3_finalize(s);
    }
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

gpc_status gpcd_store_alert_open(gpcd_store *store, int gpu, const char *kind, const char *message,
                                 double now, int64_t *id_out) {
    sqlite3_stmt *s;
    pthread_mutex_lock(&store->db_lock);
    gpc_status st =
        prepare(store, "INSERT INTO alerts(gpu, kind, message, start_time) VALUES(?,?,?,?)", &s);
    if (st == GPC_OK) {
        sqlite3_bind_int(s, 1, gpu);
        sqlite3_bind_text(s, 2, kind, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 3, message, -1, SQLITE_TRANSIENT);
        sqlite3_bind_double(s, 4, now);
        if (sqlite3_step(s) != SQLITE_DONE)
            st = store_fail(store, "saving an alert");
        else
            *id_out = sqlite3_last_insert_rowid(store->db);
        sqlite3_finalize(s);
    }
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

gpc_status gpcd_store_alert_close(gpcd_store *store, int64_t id, double now) {
    sqlite3_stmt *s;
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = prepare(store, "UPDATE alerts SET end_time = ? WHERE id = ?", &s);
    if (st == GPC_OK) {
        sqlite3_bind_double(s, 1, now);
        sqlite3_bind_int64(s, 2, id);
        if (sqlite3_step(s) != SQLITE_DONE) st = store_fail(store, "closing an alert");
        sqlite3_finalize(s);
    }
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

gpc_status gpcd_store_prune_finished(gpcd_store *store, double ended_before, int most, int64_t *ids,
                                     int *count) {
    *count = 0;
    sqlite3_stmt *pick = NULL, *events = NULL, *job = NULL;
    char states[64], sql[256];
    state_filter(1u << GPCD_COMPLETED | 1u << GPCD_FAILED | 1u << GPCD_CANCELLED, states,
                 sizeof states);
    /* the oldest first, through jobs_end */
    snprintf(sql, sizeof sql,
             "SELECT id FROM jobs WHERE end_time < ?1 AND %s ORDER BY end_time LIMIT ?2", states);
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = exec_sql(store, "BEGIN IMMEDIATE");
    if (st == GPC_OK) st = prepare(store, sql, &pick);
    if (st == GPC_OK) st = prepare(store, "DELETE FROM job_events WHERE job_id = ?", &events);
    if (st == GPC_OK) st = prepare(store, "DELETE FROM jobs WHERE id = ?", &job);
    if (st == GPC_OK) {
        sqlite3_bind_double(pick, 1, ended_before);
        sqlite3_bind_int(pick, 2, most);
        int rc;
        while (*count < most && (rc = sqlite3_step(pick)) == SQLITE_ROW)
            ids[(*count)++] = sqlite3_column_int64(pick, 0);
        if (*count < most && rc != SQLITE_DONE) st = store_fail(store, "finding finished jobs");
    }
    for (int i = 0; st == GPC_OK && i < *count; i++) {
        sqlite3_reset(events);
        sqlite3_reset(job);
        sqlite3_bind_int64(events, 1, ids[i]);
        sqlite3_bind_int64(job, 1, ids[i]);
        if (sqlite3_step(events) != SQLITE_DONE || sqlite3_step(job) != SQLITE_DONE)
            st = store_fail(store, "removing a finished job");
    }
    sqlite3_finalize(pick);
    sqlite3_finalize(events);
    sqlite3_finalize(job);
    st = end_transaction(store, st);
    if (st != GPC_OK) *count = 0;
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

gpc_status gpcd_store_state_counts(gpcd_store *store, int64_t counts[GPCD_STATE_COUNT]) {
    sqlite3_stmt *s;
    memset(counts, 0, sizeof(int64_t) * GPCD_STATE_COUNT);
    pthread_mutex_lock(&store->db_lock);
    gpc_status st = prepare(store, "SELECT state, COUNT(*) FROM jobs GROUP BY state", &s);
    if (st == GPC_OK) {
        while (sqlite3_step(s) == SQLITE_ROW) {
            int state = sqlite3_column_int(s, 0);
            if (state >= 0 && state < GPCD_STATE_COUNT) counts[state] = sqlite3_column_int64(s, 1);
        }
        sqlite3_finalize(s);
    }
    pthread_mutex_unlock(&store->db_lock);
    return st;
}

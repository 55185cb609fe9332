/* mango_heap_check.c -- room in the durable heap for a command, before it runs
 * (durable Redis).
 *
 * Compiled into redis-server next to mango_adapter.c (see docs/redis.md, "A
 * full pool", and the processCommand() row of "What the patch changes").
 *
 * The pool's durable heap has a fixed size, and Redis aborts on an
 * allocation that fails ("OUT OF MEMORY", a bug report, the pool intact).
 * So a command that may grow memory is refused with an OOM error, before it
 * runs, while the heap's room is short of what it may make
 * (mangoHeapRefusal, from mangoRefuseCommand; mangoRefuseScriptCommand for
 * a command a script calls):
 *   - twice its arguments (a durable copy of each, and the value built
 *     from them), ARGUMENT_OVERHEAD bytes an argument, and a reserve
 *     (heap_reserve);
 *   - the strings it grows (SETRANGE, SETBIT, BITFIELD, APPEND, BITOP, COPY);
 *   - the tables its dicts double into: the keyspace and expires of the
 *     database it adds keys to, the hash, set or sorted set it adds to;
 *   - the small (intset, listpack) values it converts to hash tables;
 *   - the values it builds from keys it reads (SUNIONSTORE, SORT, COPY ...);
 *   - for DEBUG POPULATE, the table it expands to and the keys it makes;
 *   - the large element a pop copies (room in one piece only).
 * An EXEC is judged by the commands it queued, in the database a queued
 * SELECT moves them to, with the dicts a queued SWAPDB gives it. Large arguments and the large strings and tables
 * must also find free room in one piece (mango_heap_fits), after a reclaim
 * of freed small objects if needed. What is not estimated (a module's
 * allocations) can still reach the abort; maxmemory below the heap's
 * capacity makes it rarer.
 */
#include "server.h"
#include "mango_adapter.h"
#include "mango.h"

#include <ctype.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

/* Room the durable heap keeps for what a command makes beyond its
 * arguments (dict tables, reply buffers, the graveyard's steps): 1/32 of it,
 * at least 1 MiB. */
static uint64_t heap_reserve(uint64_t capacity)
{
    return capacity / 32 > (1u << 20) ? capacity / 32 : (1u << 20);
}

/* Arguments from this size on are checked for room in one piece. */
#define BIG_ARGUMENT (64u << 10)

/* The chunk a large allocation of len bytes takes: a page multiple with the
 * heap's 8-byte header (sds adds up to 17 bytes). */
static uint64_t chunk_room(uint64_t len)
{
    return (len + 8 + 17 + 4095) & ~(uint64_t)4095;
}

/* The room in one piece that the command's big arguments (those of the
 * queued commands for EXEC) need for a durable copy each. *largest: the
 * longest. */
static uint64_t big_arguments_room(client *c, int exec, uint64_t *largest)
{
    uint64_t room = 0;
    for (int k = -1; k < (exec ? c->mstate.count : 0); k++) {
        robj **argv = k < 0 ? c->argv : c->mstate.commands[k].argv;
        int argc = k < 0 ? c->argc : c->mstate.commands[k].argc;
        for (int j = 0; j < argc; j++) {
            if (!argv[j] || !sdsEncodedObject(argv[j])) continue;
            size_t len = sdslen(argv[j]->ptr);
            if (len < BIG_ARGUMENT) continue;
            room += chunk_room(len);
            if (len > *largest) *largest = len;
        }
    }
    return room;
}

/* ---- strings a command grows ------------------------------------------------ *
 * A few commands make a string far larger than their arguments: SETRANGE k
 * 200000000 x asks for 200 MB, as do SETBIT and BITFIELD with a large
 * offset; APPEND reallocates its value, BITOP makes a string as long as its
 * longest source, COPY duplicates one. Counting only their arguments, the
 * heap check let them run into an allocation that failed, and Redis aborted
 * for OUT OF MEMORY (any client could stop the server so). Their result is
 * estimated before they run, from the key as it is now: the new string's
 * length, and the allocation sds makes for it (an existing string grows
 * greedily, as sdsMakeRoomFor does: twice the length below 1 MiB, 1 MiB more
 * above; unless the string already has the room). A command Redis will
 * refuse by itself (a bad offset, a wrong type, past proto-max-bulk-len) is
 * estimated at 0, so that it gets Redis's own error. */

/* The value at key, looked up with no side effect (no expiry, no access
 * time; no rehash step outside a write section, mangoDictMayRehash): NULL
 * when the key is missing. */
static robj *peek_value(client *c, robj *key)
{
    return key && sdsEncodedObject(key) ? dictFetchValue(c->db->dict, key->ptr) : NULL;
}

/* The string value at key: NULL when the key is missing or holds another
 * type (*other then set). */
static robj *peek_string(client *c, robj *key, int *other)
{
    robj *o = peek_value(c, key);
    *other = o && o->type != OBJ_STRING;
    return *other ? NULL : o;
}

/* What making the string o (NULL: a new one) target bytes long allocates.
 * (The callers leave out what Redis refuses by itself, as Redis checks it:
 * SETRANGE and APPEND their result's length, SETBIT and BITFIELD each
 * offset, which lets a BITFIELD reach up to 8 bytes past
 * proto-max-bulk-len.) */
static uint64_t string_allocation(robj *o, uint64_t target)
{
    if (!o) return target;                            /* sdsnewlen: exact */
    if (target <= stringObjectLen(o)) return 0;
    if (o->encoding == OBJ_ENCODING_RAW && o->refcount == 1 && sdsalloc(o->ptr) >= target) return 0;
    return target < SDS_MAX_PREALLOC ? 2 * target : target + SDS_MAX_PREALLOC;
}

static int arg_ll(robj *o, long long *v)
{
    return o && sdsEncodedObject(o) && string2ll(o->ptr, sdslen(o->ptr), v);
}

/* BITFIELD key [GET type offset] [SET type offset value] [INCRBY type offset
 * increment] [OVERFLOW how]: the byte length its writes need, 0 with none
 * (or a malformed request, which Redis refuses). */
static uint64_t bitfield_length(robj **argv, int argc)
{
    uint64_t highest = 0;
    int writes = 0;
    for (int j = 2; j < argc;) {
        if (!sdsEncodedObject(argv[j])) return 0;
        const char *op = argv[j]->ptr;
        if (!strcasecmp(op, "overflow")) {
            j += 2;
            continue;
        }
        int set = !strcasecmp(op, "set"), incr = !strcasecmp(op, "incrby");
        if ((!set && !incr && strcasecmp(op, "get")) || j + 2 >= argc) return 0;
        if (!sdsEncodedObject(argv[j + 1]) || !sdsEncodedObject(argv[j + 2])) return 0;
        const char *type = argv[j + 1]->ptr, *off = argv[j + 2]->ptr;
        long long bits, offset;
        if ((type[0] != 'i' && type[0] != 'u') || !string2ll(type + 1, strlen(type + 1), &bits) ||
            bits < 1 || bits > 64)
            return 0;
        int scaled = off[0] == '#';
        if (!string2ll(off + scaled, strlen(off + scaled), &offset) || offset < 0) return 0;
        if (scaled) {
            if (offset > LLONG_MAX / 64) return 0;
            offset *= bits;
        }
        if ((offset >> 3) >= server.proto_max_bulk_len) return 0; /* Redis refuses it */
        if (set || incr) {
            if (j + 3 >= argc) return 0;
            writes = 1;
            if ((uint64_t)offset + (uint64_t)bits - 1 > highest) highest = (uint64_t)offset + (uint64_t)bits - 1;
            j += 4;
        } else {
            j += 3;
        }
    }
    return writes ? (highest >> 3) + 1 : 0;
}

/* The largest string the command (not queued: run now) allocates beyond
 * its arguments, in bytes; 0 for the other commands. */
static uint64_t string_growth(client *c, struct redisCommand *cmd, robj **argv, int argc)
{
    int other;
    long long v;
    if (!cmd) return 0;
    if (cmd->proc == appendCommand && argc == 3 && sdsEncodedObject(argv[2])) {
        robj *o = peek_string(c, argv[1], &other);
        uint64_t target = o ? stringObjectLen(o) + sdslen(argv[2]->ptr) : 0;
        return o && target <= (uint64_t)server.proto_max_bulk_len ? string_allocation(o, target) : 0;
    }
    if (cmd->proc == setrangeCommand && argc == 4 && sdsEncodedObject(argv[3])) {
        if (!arg_ll(argv[2], &v) || v < 0 || sdslen(argv[3]->ptr) == 0) return 0;
        uint64_t target = (uint64_t)v + sdslen(argv[3]->ptr);
        if (target > (uint64_t)server.proto_max_bulk_len) return 0; /* refused */
        robj *o = peek_string(c, argv[1], &other);
        return other ? 0 : string_allocation(o, target);
    }
    if ((cmd->proc == setbitCommand && argc == 4) || cmd->proc == bitfieldCommand) {
        uint64_t len;
        if (cmd->proc == setbitCommand) {
            if (!arg_ll(argv[2], &v) || v < 0 || (v >> 3) >= server.proto_max_bulk_len) return 0; /* refused */
            len = ((uint64_t)v >> 3) + 1;
        } else {
            len = bitfield_length(argv, argc);
        }
        if (!len) return 0;
        robj *o = peek_string(c, argv[1], &other);
        return other ? 0 : string_allocation(o, len);
    }
    if (cmd->proc == bitopCommand && argc >= 4) {
        uint64_t longest = 0;
        for (int j = 3; j < argc; j++) {
            robj *o = peek_string(c, argv[j], &other);
            if (other) return 0;
            if (o && stringObjectLen(o) > longest) longest = stringObjectLen(o);
        }
        return string_allocation(NULL, longest);
    }
    if (cmd->proc == copyCommand && argc >= 3) {
        robj *o = peek_string(c, argv[1], &other);
        return o ? string_allocation(NULL, stringObjectLen(o)) : 0;
    }
    return 0;
}

/* ---- tables a dict doubles into ----------------------------------------- *
 * A dict that has as many entries as buckets allocates a table twice the
 * size at its next insert: 8 MB for the keyspace's 524 288th key, 128 MB for
 * its 8 388 608th. Filling a 64 MiB pool with small SETs made Redis abort
 * there, with 46 of 58 MB in use, before the reserve was ever short. So a
 * command is also counted the tables of the dicts it may add to, should it
 * reach that point: the db's keyspace and expires, and the hash, set or
 * sorted set at its first argument. */

/* The largest table inserting up to adds entries into d allocates, in
 * bytes, as _dictExpandIfNeeded decides it: an insert into a dict with as
 * many entries as buckets doubles it (while rehashing, the new table is the
 * one counted). 0 if none; 0 too when the dict's type refuses the next
 * expansion now, as the keyspace does past maxmemory. adds is an upper
 * bound (a command's arguments): a command is counted a table a few
 * entries early. */
static uint64_t next_table(dict *d, uint64_t adds)
{
    if (!d || adds == 0) return 0;
    int t = dictIsRehashing(d) ? 1 : 0;
    unsigned long size = DICTHT_SIZE(d->ht_size_exp[t]);
    uint64_t used = d->ht_used[0] + d->ht_used[1], last = used + adds - 1; /* entries before the last insert */
    if (size == 0 || last < size) return 0; /* (an empty dict's first table is 4 buckets) */
    uint64_t next = size;
    while (next <= last) next <<= 1;
    uint64_t bytes = next * sizeof(dictEntry *);
    if (!t && used >= size && d->type->expandAllowed &&
        !d->type->expandAllowed(size * 2 * sizeof(dictEntry *), (double)used / size))
        return 0;
    return bytes;
}

/* How many keys a command may add: for a command whose key specs name one
 * key each (SET, HSET, COPY, SMOVE, RENAME, ...), those that insert,
 * overwrite or update (at least one); at most one per argument otherwise
 * (MSET, SUNIONSTORE's sources, EVAL, commands without key specs). */
static uint64_t keys_added_at_most(struct redisCommand *cmd, int argc)
{
    uint64_t n = 0;
    for (int i = 0; cmd && i < cmd->key_specs_num; i++) {
        keySpec *ks = &cmd->key_specs[i];
        if (ks->find_keys_type != KSPEC_FK_RANGE || ks->fk.range.lastkey != 0) {
            n = 0;
            break;
        }
        if (ks->flags & (CMD_KEY_INSERT | CMD_KEY_OW | CMD_KEY_UPDATE)) n++;
        else if (!n && i == cmd->key_specs_num - 1) n = 1;
    }
    if (n) return n;
    return argc > 1 ? (uint64_t)argc - 1 : 0;
}

/* The dict of the hash, set or sorted set at key; NULL if it has none
 * (missing, or a listpack or intset). */
static dict *value_dict(client *c, robj *key)
{
    robj *o = peek_value(c, key);
    if (!o) return NULL;
    if ((o->type == OBJ_HASH || o->type == OBJ_SET) && o->encoding == OBJ_ENCODING_HT) return o->ptr;
    if (o->type == OBJ_ZSET && o->encoding == OBJ_ENCODING_SKIPLIST) return ((zset *)o->ptr)->dict;
    return NULL;
}

/* What a command makes beyond its arguments: bytes in all, the room in one
 * piece its large allocations need, the largest. */
typedef struct growth {
    uint64_t bytes, room, largest;
} growth;

static void growth_add(growth *g, uint64_t n)
{
    g->bytes += n;
    if (n >= BIG_ARGUMENT) g->room += chunk_room(n);
    if (n > g->largest) g->largest = n;
}

/* ---- values a command builds from keys it reads ----------------------------- *
 * COPY of a hash, SUNIONSTORE, ZUNIONSTORE, SORT ... STORE, GEOSEARCHSTORE
 * and the like build a value from keys they only read (their key specs say
 * RO) and store it under another key: it can be as large as those keys
 * together, from arguments of a few bytes. Estimated before they run: the
 * sources' sizes as MEMORY USAGE estimates them (objectComputeSize, 5
 * samples; an intersection its smallest source, a difference its first),
 * and, in one piece, a dict table for as many elements as they hold (the
 * destination's, when it is a hash table; ZUNIONSTORE's accumulator too).
 * Also SORT with no STORE: it is a write command, so its sort vector (16
 * bytes an element, one piece) and the objects it makes come from the
 * durable heap too (a SORT ... LIMIT 0 10 of a 200 000-member set made
 * Redis abort on a nearly full heap). GEORADIUS without STORE is counted
 * the same way (conservative: it may return the whole set). Strings are
 * left to string_growth. */
size_t objectComputeSize(robj *key, robj *o, size_t sample_size, int dbid); /* object.c */

static uint64_t elements_of(robj *o)
{
    switch (o->type) {
    case OBJ_LIST: return listTypeLength(o);
    case OBJ_SET: return setTypeSize(o);
    case OBJ_ZSET: return zsetLength(o);
    case OBJ_HASH: return hashTypeLength(o);
    default: return 0;
    }
}

static uint64_t table_for(uint64_t entries)
{
    uint64_t buckets = 4;
    while (buckets < entries) buckets <<= 1;
    return buckets * sizeof(dictEntry *);
}

static void source_growth(client *c, struct redisCommand *cmd, robj **argv, int argc, growth *g)
{
    int reads = 0;
    for (int i = 0; i < cmd->key_specs_num; i++)
        if (cmd->key_specs[i].flags & CMD_KEY_RO) reads = 1;
    if (!reads) return; /* (HSET, SET, LPUSH, ...: one look at their specs) */
    /* An intersection is no larger than its smallest source (a missing one:
     * empty), a difference than its first; other results than all of them. */
    int smallest = cmd->proc == sinterstoreCommand || cmd->proc == zinterstoreCommand;
    int first = cmd->proc == sdiffstoreCommand || cmd->proc == zdiffstoreCommand;
    getKeysResult keys = GETKEYS_RESULT_INIT;
    int n = getKeysFromCommandWithSpecs(cmd, argv, argc, GET_KEYSPEC_DEFAULT, &keys);
    uint64_t bytes = 0, elements = 0;
    int sources = 0;
    for (int i = 0; i < n; i++) {
        if (!(keys.keys[i].flags & CMD_KEY_RO) || keys.keys[i].pos >= argc) continue;
        robj *key = argv[keys.keys[i].pos];
        if (!sdsEncodedObject(key)) continue;
        if (first && sources) break;
        robj *o = peek_value(c, key);
        uint64_t b = 0, e = 0;
        if (o && o->type != OBJ_STRING) {
            b = objectComputeSize(key, o, 5, c->db->id);
            e = elements_of(o);
        }
        if (smallest && sources && b >= bytes) {
            sources++;
            continue;
        }
        bytes = smallest ? b : bytes + b;
        elements = smallest ? e : elements + e;
        sources++;
    }
    getKeysFreeResult(&keys);
    g->bytes += bytes;
    if (cmd->proc == sortCommand) {
        growth_add(g, elements * 16); /* its vector: one redisSortObject per element, in one piece */
    } else if (elements >= 128) {  /* below, a listpack or intset */
        growth_add(g, table_for(elements));
        if (cmd->proc == zunionstoreCommand) growth_add(g, table_for(elements)); /* its accumulator too */
    }
}

/* The dicts (and compact values, below) a command (an EXEC: all it queued)
 * adds to, each with the entries it may add in all, so that each table is
 * counted once. */
#define NOTED_MAX 16
typedef struct noted {
    void *p[NOTED_MAX]; /* a dict, or a compact value's robj */
    uint64_t adds[NOTED_MAX];
    int breaks[NOTED_MAX]; /* compact values: an argument breaks the encoding's limits by itself */
    int n;
} noted;

/* Adds to p's entry; 0 if p is new and the table is full (the caller then
 * counts p on its own). */
static int note(noted *t, void *p, uint64_t adds, int breaks)
{
    for (int i = 0; i < t->n; i++)
        if (t->p[i] == p) {
            t->adds[i] += adds;
            t->breaks[i] |= breaks;
            return 1;
        }
    if (t->n == NOTED_MAX) return 0;
    t->p[t->n] = p;
    t->adds[t->n] = adds;
    t->breaks[t->n++] = breaks;
    return 1;
}

static void dict_note(noted *dn, growth *g, dict *d, uint64_t adds)
{
    if (!note(dn, d, adds, 0)) growth_add(g, next_table(d, adds)); /* many dicts: each on its own */
}

/* ---- compact values that become hash tables ------------------------------ *
 * A small set of integers is an intset, a small hash or sorted set a
 * listpack: one allocation. The command that gives it an entry past its
 * limits (set-max-intset-entries, a member that is not an integer;
 * hash-/zset-max-listpack-entries and -value) converts it at once: every
 * entry becomes a dictEntry and strings of its own (a sorted set's also a
 * skiplist node), under a table for all of them. An EXEC of 300 SADDs of a
 * string to 300 sets of 500 integers asked for about 9 MB that way, from
 * 5 KB of arguments, and Redis aborted on a pool with 2.8 MB free. Counted
 * per value once (an EXEC may add to it many times): its entries, those the
 * commands add, CONVERTED_ENTRY bytes each, the compact encoding's bytes
 * (the strings it held), and the table, in one piece. */
#define CONVERTED_ENTRY 96

static uint64_t compact_entries(robj *o, uint64_t *bytes)
{
    if (o->type == OBJ_SET && o->encoding == OBJ_ENCODING_INTSET) {
        *bytes = intsetBlobLen(o->ptr);
        return intsetLen(o->ptr);
    }
    if ((o->type == OBJ_HASH || o->type == OBJ_ZSET) && o->encoding == OBJ_ENCODING_LISTPACK) {
        *bytes = lpBytes(o->ptr);
        return lpLength(o->ptr) / 2;
    }
    return 0;
}

/* The entries a compact value of o's type holds before it converts. */
static uint64_t compact_limit(robj *o)
{
    if (o->type == OBJ_SET) return server.set_max_intset_entries;
    if (o->type == OBJ_HASH) return server.hash_max_listpack_entries;
    return server.zset_max_listpack_entries;
}

static int converts(robj *o, uint64_t entries) { return entries > compact_limit(o); }

static void conversion_growth(growth *g, robj *o, uint64_t adds, int breaks)
{
    uint64_t bytes = 0, entries = compact_entries(o, &bytes) + adds;
    if (!breaks && !converts(o, entries)) return;
    g->bytes += entries * CONVERTED_ENTRY + bytes;
    growth_add(g, table_for(entries));
}

/* The type of compact value a command adds entries to (-1: none it
 * converts; SORT, SUNIONSTORE and the like read or overwrite theirs). */
static int compact_kind(struct redisCommand *cmd)
{
    redisCommandProc *p = cmd->proc;
    if (p == saddCommand || p == smoveCommand) return OBJ_SET;
    if (p == hsetCommand || p == hsetnxCommand || p == hincrbyCommand || p == hincrbyfloatCommand)
        return OBJ_HASH; /* (HMSET is hsetCommand) */
    if (p == zaddCommand || p == zincrbyCommand || p == geoaddCommand) return OBJ_ZSET;
    return -1;
}

static int is_zadd_option(robj *a)
{
    static const char *const opts[] = {"nx", "xx", "gt", "lt", "ch", "incr"};
    if (!sdsEncodedObject(a)) return 0;
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (!strcasecmp(a->ptr, opts[i])) return 1;
    return 0;
}

/* How many of the entries in argv[from..argc-1] the value at o lacks: set
 * members; hash fields (field, value pairs); sorted-set members (after
 * ZADD's or GEOADD's options: score, member or longitude, latitude,
 * member). Asked only when the count from the arguments alone would pass
 * the encoding's limit, so that an update of a hash at its limit adds
 * nothing; each lookup scans the listpack, so it stops once more than room
 * (what the encoding still holds) are new: the conversion is certain, and
 * the entries not looked at are counted as new. */
static uint64_t entries_new(robj *o, robj **argv, int from, int argc, int per, uint64_t room)
{
    if (o->type == OBJ_ZSET)
        while (from < argc && is_zadd_option(argv[from])) from++;
    uint64_t n = 0;
    for (int i = from; i + per - 1 < argc; i += per) {
        if (n > room) return n + (uint64_t)(argc - i) / (uint64_t)per;
        robj *e = argv[o->type == OBJ_ZSET ? i + per - 1 : i];
        if (!sdsEncodedObject(e)) {
            n++;
            continue;
        }
        double score;
        int have = o->type == OBJ_SET    ? setTypeIsMember(o, e->ptr)
                   : o->type == OBJ_HASH ? hashTypeExists(o, e->ptr)
                                         : zsetScore(o, e->ptr, &score) == C_OK;
        n += !have;
    }
    return n;
}

/* Arguments argv[from..argc-1] of a command of compact_kind() kind added to
 * the value at key: noted if it is compact and of that kind. 1 if noted
 * (its conversion counts the table it may need). */
static int compact_note(noted *cn, growth *g, client *c, int kind, robj *key, robj **argv, int from,
                        int argc, int per, uint64_t adds)
{
    robj *o = kind >= 0 ? peek_value(c, key) : NULL;
    if (!o || (int)o->type != kind) return 0; /* (another type: WRONGTYPE) */
    if (o->encoding != OBJ_ENCODING_INTSET && o->encoding != OBJ_ENCODING_LISTPACK) return 0;
    int breaks = 0;
    for (int i = from; i < argc && !breaks; i++) {
        if (!sdsEncodedObject(argv[i])) continue;
        size_t len = sdslen(argv[i]->ptr);
        long long v;
        if (o->type == OBJ_SET) breaks = !string2ll(argv[i]->ptr, len, &v);
        else if (o->type == OBJ_HASH) breaks = len > server.hash_max_listpack_value;
        else breaks = len > server.zset_max_listpack_value;
    }
    uint64_t bytes, held = compact_entries(o, &bytes);
    if (!breaks && converts(o, held + adds))
        adds = entries_new(o, argv, from, argc, per, compact_limit(o) > held ? compact_limit(o) - held : 0);
    if (!note(cn, o, adds, breaks)) conversion_growth(g, o, adds, breaks); /* many values: each on its own */
    return 1;
}

/* The arguments a command of these categories needs to add one entry to the
 * value at its first argument: a set's member; a field and its value, a
 * score and its member; a longitude, a latitude and a member. 0: another
 * kind of command. */
static int args_per_entry(struct redisCommand *cmd)
{
    if (cmd->acl_categories & ACL_CATEGORY_GEO) return 3;
    if (cmd->acl_categories & ACL_CATEGORY_SET) return 1;
    if (cmd->acl_categories & (ACL_CATEGORY_HASH | ACL_CATEGORY_SORTEDSET)) return 2;
    return 0;
}

/* What each entry a command adds costs beyond its bytes, at most: a
 * dictEntry (32 bytes as the heap rounds it), an sds header and the
 * rounding of one or two small objects, or a skiplist node. Counted per
 * argument: HSET h with 300 000 one-byte fields and values made Redis
 * abort with 12 MB free, its arguments being 2 MB. */
#define ARGUMENT_OVERHEAD 64

/* ---- other keys' dicts, other databases, DEBUG POPULATE ------------------- *
 * Most commands add to the value at their first key and to their own
 * database. SMOVE adds its member to the set at its second key; MOVE and
 * COPY ... DB add a key to another database's keyspace; a SELECT queued in
 * MULTI makes the commands after it run in another database; DEBUG
 * POPULATE n (no CMD_DENYOOM: DEBUG is an admin command) expands the
 * keyspace's table to n buckets at once and adds up to n keys (a POPULATE
 * of 10 million keys asks for a 128 MB table first). Each is counted where
 * it adds. */

/* The database a DB argument names, as Redis parses it; NULL if it names
 * none (Redis then refuses the command by itself). */
static redisDb *db_named(robj *arg)
{
    long long id;
    if (!arg_ll(arg, &id) || id < 0 || id >= server.dbnum) return NULL;
    return &server.db[id];
}

/* The database a MOVE or COPY ... DB names; NULL for other commands. */
static redisDb *target_db(struct redisCommand *cmd, robj **argv, int argc)
{
    redisDb *db = NULL;
    if (cmd->proc == moveCommand && argc == 3) db = db_named(argv[2]);
    if (cmd->proc == copyCommand)
        for (int j = 3; j + 1 < argc; j++)
            if (sdsEncodedObject(argv[j]) && !strcasecmp(argv[j]->ptr, "db")) db = db_named(argv[++j]);
    return db;
}

/* Can the command give a key a TTL (an entry in the expires dict)? SET
 * and its variants, GETEX, the EXPIRE family, RESTORE, and the commands
 * that carry a key's TTL to another key: COPY, RENAME, MOVE. */
static int may_set_ttl(struct redisCommand *cmd)
{
    void (*p)(client *) = cmd->proc;
    return p == setCommand || p == setexCommand || p == psetexCommand || p == getexCommand ||
           p == expireCommand || p == pexpireCommand || p == expireatCommand || p == pexpireatCommand ||
           p == restoreCommand || p == copyCommand || p == renameCommand || p == renamenxCommand ||
           p == moveCommand;
}

static int is_populate(struct redisCommand *cmd, robj **argv, int argc)
{
    return cmd->proc == debugCommand && argc >= 3 && argc <= 5 && sdsEncodedObject(argv[1]) &&
           !strcasecmp(argv[1]->ptr, "populate");
}

/* Does a command (run now or queued) make memory the heap check counts? */
static int may_grow(struct redisCommand *cmd, robj **argv, int argc)
{
    return cmd && ((cmd->flags & CMD_DENYOOM) || is_populate(cmd, argv, argc));
}

/* Write commands without CMD_DENYOOM (Redis lets them run past maxmemory:
 * they add little) that still add an entry to a dict, which may double its
 * table. Keys: SMOVE (and a member to the set at its second key), MOVE
 * (into another database), RENAME and RENAMENX (the new name is added
 * before the old one is deleted). TTLs, in the expires dict: the EXPIRE
 * family, GETEX with EX, PX, EXAT or PXAT. Such a command is refused only
 * for a table that has no room. (Stream commands that add to a consumer
 * group's pending list add radix-tree nodes, no table.) */
static int adds_keys_without_denyoom(struct redisCommand *cmd)
{
    void (*p)(client *) = cmd->proc;
    return p == smoveCommand || p == moveCommand || p == renameCommand || p == renamenxCommand;
}

static int adds_ttl_without_denyoom(struct redisCommand *cmd, robj **argv, int argc)
{
    void (*p)(client *) = cmd->proc;
    if (p == getexCommand) return argc >= 4 && sdsEncodedObject(argv[2]) && strcasecmp(argv[2]->ptr, "persist");
    return p == expireCommand || p == pexpireCommand || p == expireatCommand || p == pexpireatCommand;
}

static int may_add_entries(struct redisCommand *cmd, robj **argv, int argc)
{
    return cmd && (adds_keys_without_denyoom(cmd) || adds_ttl_without_denyoom(cmd, argv, argc));
}

/* ---- write commands without CMD_DENYOOM that still make memory ----------
 * (found by a review, session 36; each made Redis abort on a pool with a
 * few MB left):
 *   - large arguments: a write command's arguments are copied into the
 *     durable heap (durable_argv in mango_adapter.c): LREM l 0 <6 MB>, an
 *     XACK or XCLAIM of 300 000 IDs;
 *   - XREADGROUP adds a pending entry (a NACK and radix-tree nodes, ~85 B
 *     measured) for every entry it delivers: COUNT of them, or every entry
 *     of the streams it names without COUNT;
 *   - MIGRATE serialises each key it moves (its DUMP payload) in the heap.
 * Pops are counted below. Not counted (docs/redis.md, "A full pool"):
 * RESTORE's decoded size, compact sources of a SUNIONSTORE/ZUNIONSTORE at
 * their converted size, the values SORT ... GET fetches, keys an EXEC makes
 * and then copies. */
#define BIG_WRITE_ARGUMENTS (64u << 10)
#define PENDING_ENTRY_BYTES 128
size_t objectComputeSize(robj *key, robj *o, size_t sample_size, int dbid); /* object.c */

/* XREAD and XREADGROUP share their proc; only XREADGROUP writes. */
static int is_xreadgroup(struct redisCommand *cmd) { return cmd->proc == xreadCommand && (cmd->flags & CMD_WRITE); }

/* The bytes of a command's arguments (for a script's client, whose
 * argv_len_sum is not kept). */
static uint64_t argument_bytes(robj **argv, int argc)
{
    uint64_t n = 0;
    for (int j = 0; j < argc; j++)
        if (argv[j] && sdsEncodedObject(argv[j])) n += sdslen(argv[j]->ptr);
    return n;
}

static int makes_memory_without_denyoom(struct redisCommand *cmd, robj **argv, int argc)
{
    if (!cmd || (cmd->flags & CMD_DENYOOM) || !(cmd->flags & CMD_WRITE)) return 0;
    return is_xreadgroup(cmd) || cmd->proc == migrateCommand || argument_bytes(argv, argc) >= BIG_WRITE_ARGUMENTS;
}

/* What such a command makes besides its arguments (counted by the caller). */
static uint64_t memory_without_denyoom(client *c, struct redisCommand *cmd, robj **argv, int argc)
{
    if (is_xreadgroup(cmd)) {
        long long count = -1;
        int streams = -1;
        for (int j = 1; j < argc; j++) {
            if (!sdsEncodedObject(argv[j])) continue;
            if (!strcasecmp(argv[j]->ptr, "count") && j + 1 < argc) arg_ll(argv[++j], &count);
            else if (!strcasecmp(argv[j]->ptr, "streams")) { streams = j + 1; break; }
            else if (!strcasecmp(argv[j]->ptr, "group")) j += 2; /* its group and consumer names */
        }
        if (streams < 0) return 0;
        int nstreams = (argc - streams) / 2;
        uint64_t entries = 0;
        for (int k = 0; k < nstreams; k++) {
            robj *o = peek_value(c, argv[streams + k]);
            uint64_t len = o && o->type == OBJ_STREAM ? ((stream *)o->ptr)->length : 0;
            entries += count > 0 && (uint64_t)count < len ? (uint64_t)count : len;
        }
        return entries * PENDING_ENTRY_BYTES;
    }
    if (cmd->proc == migrateCommand && argc >= 6) {
        /* MIGRATE host port key|"" db timeout [...] [KEYS key ...] */
        uint64_t bytes = 0;
        int keys_at = 3, last = 3;
        for (int j = 6; j < argc; j++)
            if (sdsEncodedObject(argv[j]) && !strcasecmp(argv[j]->ptr, "keys")) { keys_at = j + 1; last = argc - 1; break; }
        for (int j = keys_at; j <= last && j < argc; j++) {
            robj *o = peek_value(c, argv[j]);
            if (o) bytes += objectComputeSize(argv[j], o, 5, c->db->id);
        }
        return bytes;
    }
    return 0;
}

/* ---- the element a pop copies --------------------------------------------
 * A pop copies the element it removes before it replies: listTypePop makes
 * a string object of the list's end element, ZPOPMIN/ZPOPMAX duplicate each
 * member they remove (one at a time), and LMOVE then pushes that copy into
 * its destination's new node. In a write section the copies come from the
 * durable heap: an RPOP of a 6 MB element with 3 MB left made Redis abort,
 * and the client's retry after the restart aborted it again. These are
 * write commands without CMD_DENYOOM (they free memory in the end), so
 * they are not held to the reserve: only a large copy is checked, for
 * room in one piece. Sized before they run, with no side effect: a list's
 * end node (the element, or a listpack of at most a few small ones around
 * it), a skiplist's members from the end it pops up to COUNT, a listpack
 * sorted set's whole listpack. Not counted: SPOP's random member (found
 * only when it runs), the pops of LPOP/RPOP/LMPOP with COUNT (they reply
 * from the list itself, with no copy). */

/* The bytes of the element(s) a pop at where (LIST_HEAD or LIST_TAIL) of
 * the value at key copies at once, at most count of them in turn. */
static uint64_t end_element_bytes(client *c, robj *key, int where, long long count)
{
    robj *o = peek_value(c, key);
    if (!o) return 0;
    if (o->type == OBJ_LIST && o->encoding == OBJ_ENCODING_QUICKLIST) {
        quicklist *ql = o->ptr;
        quicklistNode *n = where == LIST_HEAD ? ql->head : ql->tail;
        return n ? n->sz : 0;
    }
    if (o->type != OBJ_ZSET) return 0;
    if (o->encoding == OBJ_ENCODING_LISTPACK) return lpBytes(o->ptr);
    if (o->encoding != OBJ_ENCODING_SKIPLIST) return 0;
    zskiplist *zsl = ((zset *)o->ptr)->zsl;
    uint64_t largest = 0;
    zskiplistNode *n = where == LIST_HEAD ? zsl->header->level[0].forward : zsl->tail;
    for (long long k = 0; n && k < count; k++) {
        if (sdslen(n->ele) > largest) largest = sdslen(n->ele);
        n = where == LIST_HEAD ? n->level[0].forward : n->backward;
    }
    return largest;
}

static int is_pop(struct redisCommand *cmd)
{
    void (*p)(client *) = cmd ? cmd->proc : NULL;
    return p == lpopCommand || p == rpopCommand || p == blpopCommand || p == brpopCommand ||
           p == rpoplpushCommand || p == brpoplpushCommand || p == lmoveCommand || p == blmoveCommand ||
           p == zpopminCommand || p == zpopmaxCommand || p == bzpopminCommand || p == bzpopmaxCommand ||
           p == zmpopCommand || p == bzmpopCommand;
}

/* The side named by a LEFT/RIGHT or MIN/MAX argument: LIST_HEAD,
 * LIST_TAIL, or -1 (Redis refuses it). */
static int side_named(robj *a)
{
    if (!a || !sdsEncodedObject(a)) return -1;
    if (!strcasecmp(a->ptr, "left") || !strcasecmp(a->ptr, "min")) return LIST_HEAD;
    if (!strcasecmp(a->ptr, "right") || !strcasecmp(a->ptr, "max")) return LIST_TAIL;
    return -1;
}

/* The largest element a pop command copies at once (0 for other commands
 * and requests Redis refuses); *copies: 2 when the copy is then pushed into
 * another list (a new node as large). */
static uint64_t popped_copy(client *c, struct redisCommand *cmd, robj **argv, int argc, int *copies)
{
    *copies = 1;
    void (*p)(client *) = cmd->proc;
    int where = p == rpopCommand || p == brpopCommand || p == rpoplpushCommand || p == brpoplpushCommand ||
                p == zpopmaxCommand || p == bzpopmaxCommand ? LIST_TAIL : LIST_HEAD;
    int first = 1, last = 1; /* the keys it may pop from */
    long long count = 1;
    if (p == lpopCommand || p == rpopCommand) {
        if (argc != 2) return 0; /* with COUNT: no copy */
    } else if (p == blpopCommand || p == brpopCommand || p == bzpopminCommand || p == bzpopmaxCommand) {
        last = argc - 2;
    } else if (p == rpoplpushCommand || p == brpoplpushCommand) {
        *copies = 2;
    } else if (p == lmoveCommand || p == blmoveCommand) {
        if (argc < 5 || (where = side_named(argv[3])) < 0) return 0;
        *copies = 2;
    } else if (p == zpopminCommand || p == zpopmaxCommand) {
        if (argc == 3 && !arg_ll(argv[2], &count)) return 0;
    } else { /* ZMPOP numkeys key ... MIN|MAX [COUNT c]; BZMPOP timeout numkeys ... */
        int at = p == bzmpopCommand ? 2 : 1;
        long long numkeys;
        if (argc <= at || !arg_ll(argv[at], &numkeys) || numkeys <= 0 || numkeys > argc - at - 2) return 0;
        first = at + 1;
        last = at + (int)numkeys;
        if ((where = side_named(argv[last + 1])) < 0) return 0;
        if (last + 3 < argc && sdsEncodedObject(argv[last + 2]) && !strcasecmp(argv[last + 2]->ptr, "count"))
            arg_ll(argv[last + 3], &count);
    }
    uint64_t largest = 0;
    for (int j = first; j <= last && j < argc; j++) {
        uint64_t n = end_element_bytes(c, argv[j], where, count);
        if (n > largest) largest = n;
    }
    return largest;
}

/* What a refused pop's error adds. */
#define POP_HINT "; a pop copies the element it removes, LTRIM, ZREMRANGEBYRANK and DEL remove elements without a copy"

/* Is the command one heap_refusal() looks at? */
static int heap_checked(struct redisCommand *cmd, robj **argv, int argc)
{
    return may_grow(cmd, argv, argc) || may_add_entries(cmd, argv, argc) ||
           makes_memory_without_denyoom(cmd, argv, argc) || is_pop(cmd);
}

/* The database a queued SELECT moves the commands after it to; NULL for
 * other commands (and a SELECT Redis will refuse). */
static redisDb *selected_db(struct redisCommand *cmd, robj **argv, int argc)
{
    return cmd && cmd->proc == selectCommand && argc == 2 ? db_named(argv[1]) : NULL;
}

/* The databases of an EXEC as its queued commands see them. A queued
 * SELECT moves the commands after it to another database, and a queued
 * SWAPDB a b gives database a the dicts that are b's now (the swap
 * exchanges the dicts of the two redisDb structs). The estimates look keys
 * up in c->db, so c->db is pointed at the struct whose dicts the selected
 * database will have, and put back after the estimate. */
typedef struct {
    client *c;
    redisDb *home;
    int selected; /* the database id the commands run in */
    int *holder;  /* database id -> the struct holding its dicts now (NULL: itself) */
} queued_dbs;

static redisDb *holder_of(queued_dbs *q, int id)
{
    return &server.db[q->holder ? q->holder[id] : id];
}

static void follow_queued(queued_dbs *q, struct redisCommand *cmd, robj **argv, int argc)
{
    redisDb *db = selected_db(cmd, argv, argc);
    if (db) q->selected = db->id;
    if (cmd && cmd->proc == swapdbCommand && argc == 3) {
        redisDb *a = db_named(argv[1]), *b = db_named(argv[2]);
        if (!a || !b) return; /* Redis refuses it */
        if (!q->holder) {
            q->holder = zmalloc(sizeof(int) * (size_t)server.dbnum);
            for (int j = 0; j < server.dbnum; j++) q->holder[j] = j;
        }
        int t = q->holder[a->id];
        q->holder[a->id] = q->holder[b->id];
        q->holder[b->id] = t;
    }
    q->c->db = holder_of(q, q->selected);
}

static void queued_dbs_end(queued_dbs *q)
{
    q->c->db = q->home;
    zfree(q->holder);
}

/* DEBUG POPULATE count [prefix] [size] makes "prefix:N" keys with
 * "value:N" values (or values of size bytes): into g their bytes (a
 * dictEntry, the key's sds, the value's object, as the heap rounds them;
 * values of up to 44 bytes are embedded in theirs, as object.c does)
 * and, in one piece, the keyspace table for all of them (dictExpand first,
 * or the doubling its inserts reach). A count Redis refuses is 0. */
static void populate_growth(client *c, robj **argv, int argc, uint64_t capacity, growth *g)
{
    long long count, size = 0;
    if (!arg_ll(argv[2], &count) || count <= 0) return;
    if (argc == 5 && (!arg_ll(argv[4], &size) || size < 0)) size = 0; /* refused after the expansion */
    uint64_t n = (uint64_t)count > capacity ? capacity : (uint64_t)count, digits = 1;
    for (uint64_t x = n - 1; x >= 10; x /= 10) digits++;
    uint64_t key = (argc >= 4 && sdsEncodedObject(argv[3]) ? sdslen(argv[3]->ptr) : 3) + 1 + digits;
    uint64_t value = size ? (uint64_t)size : 6 + digits;
#define ROUND16(x) (((x) + 15) & ~15ull)
    uint64_t per_key = 32 + ROUND16(key + 2) + (value <= 44 ? ROUND16(value + 20) : 16 + ROUND16(value + 10));
#undef ROUND16
    g->bytes += n > capacity / per_key ? capacity + 1 : n * per_key; /* (more than the heap: refused) */
    if (value >= BIG_ARGUMENT) { /* each value a large chunk: in one piece, as the others */
        uint64_t each = chunk_room(value);
        g->room += n > capacity / each ? capacity + 1 : n * each;
        if (value > g->largest) g->largest = value;
    }
    /* dictExpand(keyspace, count): a table of count buckets (rounded up to
     * a power of two; none if that is the table's size, or fewer than the
     * keys it holds, or while it rehashes), then the doubling the inserts
     * may reach past it. */
    dict *d = c->db->dict;
    uint64_t used = dictSize(d), buckets = DICTHT_SIZE(d->ht_size_exp[0]);
    if (n >= used && !dictIsRehashing(d) && table_for(n) != buckets * sizeof(dictEntry *)) {
        buckets = table_for(n) / sizeof(dictEntry *);
        growth_add(g, table_for(n));
    }
    if (used + n > buckets) growth_add(g, table_for(used + n));
}

/* Why a command that may grow memory (CMD_DENYOOM; an EXEC by what it
 * queued) cannot run now, as an error reply, or NULL if it may. c runs the
 * command (a script's client for a command a script calls); args: the bytes
 * of its arguments. */
static sds heap_refusal(client *c, int exec, uint64_t args)
{
    uint64_t allocated, capacity;
    mango_heap_room(&allocated, &capacity);
    if (!capacity) return NULL;
    growth g = {0};
    noted dn = {.n = 0}, cn = {.n = 0}; /* dicts; compact values */
    uint64_t argcs = 0;
    int grows = 0; /* one command may grow memory (else only a table is refused) */
    int pops = 0;  /* one pop copies a large element (checked for room in one piece only) */
    /* Queued commands after a SELECT or a SWAPDB (queued_dbs). */
    queued_dbs q = {.c = c, .home = c->db, .selected = c->db->id, .holder = NULL};
    for (int k = 0; !exec && (c->flags & CLIENT_MULTI) && k < c->mstate.count; k++) {
        multiCmd *m = &c->mstate.commands[k]; /* being queued: after those queued before it */
        follow_queued(&q, m->cmd, m->argv, m->argc);
    }
    for (int k = exec ? 0 : -1; k < (exec ? c->mstate.count : 0); k++) {
        multiCmd *m = k < 0 ? NULL : &c->mstate.commands[k];
        struct redisCommand *cmd = m ? m->cmd : c->cmd;
        robj **argv = m ? m->argv : c->argv;
        int argc = m ? m->argc : c->argc;
        if (m) follow_queued(&q, cmd, argv, argc);
        int grows_memory = may_grow(cmd, argv, argc);
        if (is_pop(cmd)) {
            int copies;
            uint64_t copy = popped_copy(c, cmd, argv, argc, &copies);
            if (copy >= BIG_ARGUMENT) {
                pops = 1;
                g.room += (uint64_t)copies * chunk_room(copy);
                if (copy > g.largest) g.largest = copy;
                if (grows_memory) g.bytes += (uint64_t)copies * copy; /* LMOVE ... (CMD_DENYOOM) */
            }
        }
        if (!grows_memory && makes_memory_without_denyoom(cmd, argv, argc)) {
            grows = 1;
            argcs += (uint64_t)argc;
            growth_add(&g, memory_without_denyoom(c, cmd, argv, argc));
            continue;
        }
        if (grows_memory) {
            grows = 1;
            argcs += (uint64_t)argc;
            growth_add(&g, string_growth(c, cmd, argv, argc));
            source_growth(c, cmd, argv, argc, &g);
        } else if (!may_add_entries(cmd, argv, argc)) {
            continue; /* (queued reads, DEL, ...) */
        }
        /* The value at the first argument, for hash, set, sorted set and geo
         * commands (SMOVE: at the second): one dictFind, whose bucket the
         * command's own lookup then finds in the cache. A new or small value
         * that the command makes a hash table is counted that table. */
        int per = argc >= 3 ? args_per_entry(cmd) : 0;
        if (cmd->proc == smoveCommand) {
            dict *vd = argc == 4 ? value_dict(c, argv[2]) : NULL;
            if (vd) dict_note(&dn, &g, vd, 1);
            else if (argc == 4) compact_note(&cn, &g, c, OBJ_SET, argv[2], argv, 3, argc, 1, 1);
        } else if (per) {
            uint64_t adds = (uint64_t)(argc - 2) / (uint64_t)per;
            dict *vd = value_dict(c, argv[1]);
            if (vd) dict_note(&dn, &g, vd, adds);
            else if (!compact_note(&cn, &g, c, compact_kind(cmd), argv[1], argv, 2, argc, per, adds) && adds >= 128)
                growth_add(&g, table_for(adds)); /* a new value (a compact one: counted with its conversion) */
        }
        /* The keyspace and expires it adds keys to (expires: only commands
         * that can set a TTL); MOVE and COPY ... DB add them to another
         * database. */
        uint64_t keys = grows_memory || adds_keys_without_denyoom(cmd) ? keys_added_at_most(cmd, argc) : 0;
        if (is_populate(cmd, argv, argc)) {
            populate_growth(c, argv, argc, capacity, &g);
            keys = 0; /* its table is counted there (not for the commands after it in an EXEC) */
        }
        /* (c->db holds the selected database's dicts; a queued SWAPDB may
         * have given them to another struct: compare ids.) */
        redisDb *to = target_db(cmd, argv, argc);
        to = to && to->id != q.selected ? holder_of(&q, to->id) : NULL;
        dict_note(&dn, &g, to ? to->dict : c->db->dict, keys);
        if (may_set_ttl(cmd)) dict_note(&dn, &g, to ? to->expires : c->db->expires, keys ? keys : 1);
    }
    queued_dbs_end(&q);
    for (int i = 0; i < dn.n; i++) growth_add(&g, next_table(dn.p[i], dn.adds[i]));
    for (int i = 0; i < cn.n; i++) conversion_growth(&g, cn.p[i], cn.adds[i], cn.breaks[i]);
    if (!grows && !g.bytes && !pops) return NULL;
    uint64_t need = 2 * args + ARGUMENT_OVERHEAD * argcs + g.bytes + heap_reserve(capacity);
    if ((grows || g.bytes) && (allocated > capacity || capacity - allocated < need)) {
        /* Right after a FLUSHALL or a big DEL the memory is still being
         * released in steps: say so rather than ask for deletions (noted by
         * a review, session 36). */
        unsigned long releasing = mangoGravesPending();
        return sdscatprintf(sdsempty(), "-OOM Mangosteen: the pool's durable heap is full (%llu of %llu bytes in "
                            "use; this command needs about %llu more, with a reserve): %s%s",
                            (unsigned long long)allocated, (unsigned long long)capacity, (unsigned long long)need,
                            releasing ? "deleted values are still being released in steps (INFO mangosteen, "
                                        "mango_objects_being_released): retry shortly"
                                      : "delete keys, set maxmemory below the heap, or start with a larger pool "
                                        "(mango-pool-size)",
                            pops ? POP_HINT : "");
    }
    /* Room by bytes in use is no promise for large values: the free space
     * may lie in pieces between live objects. Their durable copies, and the
     * large strings and tables the command makes, are asked for one piece that holds
     * them all (conservative: it serves them one after the other, first
     * fit), plus a margin for the small allocations around them (a small
     * request may take a page of a free piece). If there is none, freed
     * small objects are reclaimed first, in a write section of its own: it
     * changes only the allocator's metadata, which no reply depends on, so
     * reads need not wait for its batch. */
    uint64_t room = big_arguments_room(c, exec, &g.largest) + g.room;
    if (!room) return NULL;
    room += BIG_ARGUMENT;
    if (mango_heap_fits(room)) return NULL;
    mangoDeletionsBegin(); /* a keyed section with no key: no read waits for it */
    int fits = mango_heap_fits(room);
    mangoDeletionsEnd();
    if (fits) return NULL;
    return sdscatprintf(sdsempty(), "-OOM Mangosteen: the pool's durable heap has no room in one piece for the "
                        "large values this command makes (%llu bytes, the largest %llu; %llu of %llu bytes in "
                        "use, the rest lies between live objects): delete keys, set maxmemory below the heap, "
                        "or start with a larger pool (mango-pool-size)%s",
                        (unsigned long long)room, (unsigned long long)g.largest, (unsigned long long)allocated,
                        (unsigned long long)capacity,
                        pops ? POP_HINT : "");
}

sds mangoHeapRefusal(client *c)
{
    if (!mangoEnabled()) return NULL;
    int exec = c->cmd->proc == execCommand && (c->flags & CLIENT_MULTI);
    int check = heap_checked(c->cmd, c->argv, c->argc);
    for (int k = 0; exec && !check && k < c->mstate.count; k++)
        check = heap_checked(c->mstate.commands[k].cmd, c->mstate.commands[k].argv, c->mstate.commands[k].argc);
    if (!check) return NULL;
    return heap_refusal(c, exec, c->argv_len_sum + (exec ? c->mstate.argv_len_sums : 0));
}

int mangoRefuseScriptCommand(client *c, sds *err)
{
    /* The same heap check for a command a script calls: Redis's own check
     * there (scriptVerifyOOM) runs only with maxmemory and only before the
     * script's first write. A script client's argv_len_sum is not kept. */
    if (!mangoEnabled() || !heap_checked(c->cmd, c->argv, c->argc)) return 0;
    sds why = heap_refusal(c, 0, argument_bytes(c->argv, c->argc));
    if (!why) return 0;
    *err = why;
    return 1;
}

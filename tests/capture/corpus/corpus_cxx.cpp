// corpus_cxx.cpp -- C++ containers and new/delete inside read-write commands,
// plugin-built with no capture calls; the verifier must find nothing missed.
#include <string>
#include <unordered_map>
#include <vector>

#include "corpus_harness.h"

struct Node {
    long key;
    std::string label;
    Node *next;
};

static std::vector<long> *vec;
static std::unordered_map<std::string, std::string> *map;
static std::string *text;
static Node *list;

static void construct() {
    vec = new std::vector<long>();
    map = new std::unordered_map<std::string, std::string>();
    text = new std::string("start");
}

static void grow_vector() {
    for (long i = 0; i < 5000; i++)
        vec->push_back(i * i);
    (*vec)[17] = -1;
}

static void strings() {
    for (int i = 0; i < 200; i++)
        *text += "a fairly long piece of text that forces reallocation ";
    text->replace(0, 5, "START");
    text->resize(text->size() / 2);
}

static void unordered_map_ops() {
    for (int i = 0; i < 2000; i++)
        (*map)["key-" + std::to_string(i)] = std::string(i % 50 + 1, 'v');
    map->erase("key-7");
    (*map)["key-8"] += " appended";
}

static void new_delete() {
    for (long i = 0; i < 500; i++)
        list = new Node{i, "node " + std::to_string(i), list};
    for (int i = 0; i < 250; i++) {
        Node *n = list;
        list = list->next;
        delete n;
    }
}

static void shrink() {
    vec->resize(10);
    vec->shrink_to_fit();
    map->clear();
}

// A function-local static: libsupc++ sets its guard (session 36: not
// captured before, so after a crash the constructor ran again over the
// restored contents).
struct table {
    long v[8];
    table() { for (long i = 0; i < 8; i++) v[i] = i + 1; }
};

static table &the_table() {
    static table t;
    return t;
}

static void local_static() { the_table().v[0] += 100; }

int main() {
    corpus_start("cxx");
    corpus_expect("new of containers", construct, false);
    corpus_expect("std::vector push_back and growth", grow_vector, false);
    corpus_expect("std::string append/replace/resize", strings, false);
    corpus_expect("std::unordered_map insert/erase", unordered_map_ops, false);
    corpus_expect("new/delete of nodes", new_delete, false);
    corpus_expect("shrink_to_fit, clear", shrink, false);
    corpus_expect("a function-local static's guard", local_static, false);
    return corpus_finish("corpus_cxx");
}

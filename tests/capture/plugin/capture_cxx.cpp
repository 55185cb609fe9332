// capture_cxx.cpp -- mango-c++ smoke test: C++ code using std::string,
// std::vector and new/delete compiles, links against the fake runtime and
// captures stores made through them.
#include "fake_runtime.h"

#include <cstdio>
#include <string>
#include <vector>

struct Node {
    long key;
    std::string value;
    Node *next;
};

static std::vector<int> *vec;
static Node *head;

static void work(int n)
{
    for (int k = 0; k < n; k++)
        vec->push_back(k * 3);
    (*vec)[0] = 12345;
    Node *x = new Node{n, std::string(40, 'x'), head};
    x->value += "-suffix";
    head = x;
}

int main()
{
    vec = new std::vector<int>();
    fr_reset();
    fr_set_active(true);
    work(100);
    fr_set_active(false);
    size_t active = fr_count;
    bool vec_elem = fr_intersects(&(*vec)[0], sizeof(int));
    bool head_ptr = fr_intersects(&head, sizeof head);

    fr_reset();
    work(10); // flag clear
    size_t inactive = fr_count;

    while (head) {
        Node *n = head->next;
        delete head;
        head = n;
    }
    delete vec;

    std::printf("captures: active=%zu inactive=%zu vec[0]=%d head=%d\n", active,
                inactive, vec_elem, head_ptr);
    bool ok = active > 0 && inactive == 0 && vec_elem && head_ptr;
    std::printf("%s\n", ok ? "PASSED" : "FAILED");
    return ok ? 0 : 1;
}

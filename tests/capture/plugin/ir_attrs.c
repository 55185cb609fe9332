/* ir_attrs.c -- attributes inferred before instrumentation must be gone after.
 * Built at -O2 twice: without the plugin (prefix PLAIN, proves LLVM infers
 * them, so the test is meaningful) and with it (prefix MANGO, stripped):
 *   mango-cc --mango-no-plugin -O2 -S -emit-llvm -o - | FileCheck -check-prefix PLAIN
 *   mango-cc -O2 -S -emit-llvm -o - | FileCheck -check-prefix MANGO
 */

// PLAIN: define {{.*}}void @fill(ptr nocapture noundef writeonly %0, {{.*}} #[[FILL:[0-9]+]]
// MANGO: define {{.*}}void @fill(ptr noundef %0, {{.*}} #[[FILL:[0-9]+]]
// MANGO: call void @mango_capture(
__attribute__((noinline)) void fill(int *p, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = i;
}

/* No store of its own: the attributes it inherits from fill are stale too. */
// PLAIN: define {{.*}}void @caller(ptr nocapture noundef writeonly %0) {{.*}} #[[CALLER:[0-9]+]]
// MANGO: define {{.*}}void @caller(ptr noundef %0) {{.*}} #[[CALLER:[0-9]+]]
// MANGO-NOT: call void @mango_capture(
// MANGO: ret void
void caller(int *p) { fill(p, 10); }

// PLAIN: attributes #[[FILL]] = { {{.*}}nosync{{.*}}memory(argmem: write)
// PLAIN: attributes #[[CALLER]] = { {{.*}}nosync{{.*}}memory(argmem: write)
// MANGO: attributes #[[FILL]] = {
// MANGO-NOT: {{nosync|memory\(}}
// MANGO-SAME: {{\}$}}
// MANGO: attributes #[[CALLER]] = {
// MANGO-NOT: {{nosync|memory\(}}
// MANGO-SAME: {{\}$}}

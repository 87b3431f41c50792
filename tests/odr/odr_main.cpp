// Links two translation units that both include attnref.hpp and instantiate the same templates:
// a non-inline definition in a header fails to link here.
float odr_a();
float odr_b();

int main() { return odr_a() == 2.0f && odr_b() == 2.0f ? 0 : 1; }

// string_instantiation.cpp -- instrumented copies of std::string.
//
// libstdc++ declares basic_string<char> an extern template: its members are
// compiled into libstdc++.so, without the capture plugin, so the bytes they
// store into a durable string (the SSO buffer, the terminating NUL, single
// characters) would not be captured. This file, compiled through the plugin
// and linked into the executable, provides an explicit instantiation whose
// definitions the program then uses instead of the library's.
#include <string>

template class std::__cxx11::basic_string<char>;

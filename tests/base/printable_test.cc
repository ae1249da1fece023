// Text printed for people cannot drive the terminal: control characters and bytes that are
// not UTF-8 are escaped; printable text, UTF-8 included, is unchanged.
#include "runtime/base/printable.h"

#include <gtest/gtest.h>

namespace pipetrain {
namespace {

TEST(Printable, EscapesControlCharactersAndBrokenUtf8Only) {
  EXPECT_EQ(Printable("job-0001 nightly run"), "job-0001 nightly run");
  EXPECT_EQ(Printable("\xc3\xa9t\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x9a\x80"),
            "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x9a\x80");  // été ✓ 🚀
  EXPECT_EQ(Printable("red\x1b[31mtext\x1b[0m"), "red\\x1b[31mtext\\x1b[0m");
  EXPECT_EQ(Printable("two\nlines\tand\rreturn\x7f"), "two\\nlines\\tand\\x0dreturn\\x7f");
  EXPECT_EQ(Printable(std::string("nul\0byte", 8)), "nul\\x00byte");
  EXPECT_EQ(Printable("bad \xff byte"), "bad \\xff byte");
  EXPECT_EQ(Printable("cut \xe2\x9c"), "cut \\xe2\\x9c");        // truncated sequence
  EXPECT_EQ(Printable("c1 \xc2\x9b[31m"), "c1 \\xc2\\x9b[31m");  // U+009B, the 8-bit CSI
  EXPECT_EQ(Printable("overlong \xc0\xaf"), "overlong \\xc0\\xaf");
}

}  // namespace
}  // namespace pipetrain

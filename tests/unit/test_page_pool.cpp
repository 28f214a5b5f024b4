// The serving scheduler's KV-cache pages (serve/page_pool.h): lending, holding and releasing; prefix
// caching's publish and match; which page is lent when none is unused, and what a forgotten page takes with
// it.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "serve/page_pool.h"

namespace anvil::test {
namespace {

using serve::PagePool;
using Ids = std::vector<int32_t>;

// Takes pages for `tokens` (whole pages of 2) and publishes each after the one before, as a sequence that
// filled them would; returns the pages that hold them (held once).
Ids fill(PagePool& pool, const Ids& tokens) {
    Ids pages;
    for (size_t at = 0; at + 2 <= tokens.size(); at += 2) {
        const int32_t p = pool.take();
        pages.push_back(pool.publish(p, pages.empty() ? -1 : pages.back(), {tokens.data() + at, 2}));
    }
    return pages;
}

TEST(PagePool, LendsHoldsAndReleases) {
    PagePool pool(4, 2, true);
    EXPECT_EQ(pool.available(), 4);
    const Ids a = {pool.take(), pool.take()};
    EXPECT_EQ(a, (Ids{0, 1})) << "unused pages lent lowest first";
    EXPECT_EQ(pool.held(), 2);
    pool.release(a);  // never published: unused again
    EXPECT_EQ(pool.available(), 4);
    EXPECT_EQ(pool.cached(), 0);
    EXPECT_THROW(pool.release(a), Error) << "released twice";
    for (int k = 0; k < 4; k++) pool.take();
    EXPECT_THROW(pool.take(), Error) << "none left";
}

TEST(PagePool, MatchesWholePagesOfTheSamePrefix) {
    PagePool pool(8, 2, true);
    const Ids ctx = {5, 6, 7, 8, 9, 10, 11};
    const Ids pages = fill(pool, ctx);  // three whole pages; the seventh position is in none
    ASSERT_EQ(pages.size(), 3u);
    for (int32_t p : pages) EXPECT_TRUE(pool.published(p));

    EXPECT_EQ(pool.match(ctx, 8), pages);
    EXPECT_EQ(pool.match(ctx, 2), (Ids{pages[0], pages[1]})) << "at most max_pages";
    EXPECT_EQ(pool.match(Ids{5, 6, 7, 8, 0, 0}, 8), (Ids{pages[0], pages[1]}))
        << "up to the first difference";
    EXPECT_EQ(pool.match(Ids{5, 6, 7}, 8), (Ids{pages[0]})) << "whole pages only";
    EXPECT_TRUE(pool.match(Ids{0, 6, 7, 8}, 8).empty()) << "the same page after another prefix";
    EXPECT_TRUE(pool.match(Ids{7, 8, 9, 10}, 8).empty()) << "the same tokens at other positions";

    // held by this sequence and matched by another: held twice, and available to neither
    EXPECT_EQ(pool.unheld(pages), 0);
    pool.hold(pages);
    pool.release(pages);
    EXPECT_EQ(pool.held(), 3);
    pool.release(pages);  // nobody holds them, but they stay matchable
    EXPECT_EQ(pool.held(), 0);
    EXPECT_EQ(pool.cached(), 3);
    EXPECT_EQ(pool.available(), 8);
    EXPECT_EQ(pool.unheld(pages), 3);
    EXPECT_EQ(pool.match(ctx, 8), pages);
    pool.hold(pages);
    EXPECT_EQ(pool.cached(), 0);
    EXPECT_EQ(pool.available(), 5);
}

TEST(PagePool, APageFilledTwiceKeepsTheFirst) {
    PagePool pool(8, 2, true);
    const Ids ctx = {1, 2, 3, 4};
    const Ids first = fill(pool, ctx);
    const Ids second = fill(pool, ctx);  // two sequences filled the same prefix in one pass
    EXPECT_EQ(second, first) << "the later copy swapped for the earlier";
    EXPECT_EQ(pool.held(), 2) << "the copies released";
    pool.release(first);
    EXPECT_EQ(pool.held(), 2);
    pool.release(second);
    EXPECT_EQ(pool.cached(), 2);
}

TEST(PagePool, LendsUnusedPagesFirstThenTheLeastRecentlyReleased) {
    PagePool pool(4, 2, true);
    const Ids a = fill(pool, {1, 2, 3, 4});  // pages 0, 1: a two-page prefix
    const Ids b = fill(pool, {9, 9});        // page 2
    pool.release(b);
    pool.release(a);  // released after b: b goes first
    EXPECT_EQ(pool.cached(), 3);
    EXPECT_EQ(pool.take(), 3) << "the unused page before any cached one";
    EXPECT_EQ(pool.take(), b[0]) << "then the one released longest ago";
    EXPECT_TRUE(pool.match(Ids{9, 9}, 8).empty()) << "its contents forgotten";
    EXPECT_EQ(pool.match(Ids{1, 2, 3, 4}, 8), a);
    // a's first page goes next, and its second with it: nobody can match the second without the first
    EXPECT_EQ(pool.take(), a[0]);
    EXPECT_EQ(pool.cached(), 0);
    EXPECT_FALSE(pool.published(a[1]));
    EXPECT_EQ(pool.available(), 1);
    EXPECT_EQ(pool.take(), a[1]);
}

TEST(PagePool, OffPublishesAndMatchesNothing) {
    PagePool pool(4, 2, false);
    const Ids pages = fill(pool, {1, 2, 3, 4});
    for (int32_t p : pages) EXPECT_FALSE(pool.published(p));
    EXPECT_TRUE(pool.match(Ids{1, 2, 3, 4}, 8).empty());
    pool.release(pages);
    EXPECT_EQ(pool.cached(), 0);
    EXPECT_EQ(pool.available(), 4);
}

TEST(PagePool, APageAfterAnUnpublishedOneStaysPrivate) {
    PagePool pool(4, 2, true);
    const int32_t p0 = pool.take(), p1 = pool.take();
    // p0 never published (it holds a prompt's last, partly filled page, say): p1 cannot follow it
    EXPECT_EQ(pool.publish(p1, p0, Ids{3, 4}), p1);
    EXPECT_FALSE(pool.published(p1));
}

}  // namespace
}  // namespace anvil::test

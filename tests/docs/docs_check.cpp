// Keeps the README and docs/ true to the repository (ctest: attnref_docs_check <source dir>):
//  * every code block in README.md that follows a marker line `<!-- snippet: <path> -->` must be
//    a contiguous run of lines of that file (the whole file or an excerpt), so the README quotes
//    code that CI compiles instead of carrying its own copy;
//  * every relative link in README.md and docs/*.md must name an existing file, and a link with
//    an anchor into a markdown file must name one of that file's headings (GitHub's slug rule);
//  * every header under include/ has at most kMaxHeaderLines lines, the size the README's
//    architecture section promises (a reader sees each piece whole).
// No attnref include: this checks text only.
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

std::vector<std::string> read_lines(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// GitHub's heading anchor: lower case; letters, digits, '-' and '_' kept; spaces become '-';
// everything else dropped.
std::string slug(const std::string& heading) {
  std::string out;
  for (unsigned char c : heading) {
    if (std::isalnum(c) || c == '-' || c == '_') {
      out += static_cast<char>(std::tolower(c));
    } else if (c == ' ') {
      out += '-';
    } else if (c >= 0x80) {
      out += static_cast<char>(c);  // non-ASCII letters are kept as they are
    }
  }
  return out;
}

std::set<std::string> anchors_of(const fs::path& md) {
  std::set<std::string> out;
  bool fenced = false;
  for (const std::string& line : read_lines(md)) {
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (fenced || line.empty() || line[0] != '#') continue;
    std::size_t i = line.find_first_not_of('#');
    if (i == std::string::npos || line[i] != ' ') continue;
    std::string text = line.substr(i + 1);
    std::string plain;  // drop inline-code backticks
    for (char c : text)
      if (c != '`') plain += c;
    out.insert(slug(plain));
  }
  return out;
}

int failures = 0;

void fail(const std::string& where, const std::string& what) {
  std::printf("FAIL %s: %s\n", where.c_str(), what.c_str());
  ++failures;
}

bool is_excerpt(const std::vector<std::string>& block, const std::vector<std::string>& file) {
  if (block.empty() || block.size() > file.size()) return false;
  for (std::size_t start = 0; start + block.size() <= file.size(); ++start) {
    bool same = true;
    for (std::size_t i = 0; i < block.size() && same; ++i) same = block[i] == file[start + i];
    if (same) return true;
  }
  return false;
}

void check_snippets(const fs::path& root, const fs::path& md, int* count) {
  const std::vector<std::string> lines = read_lines(md);
  const std::string marker = "<!-- snippet: ";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind(marker, 0) != 0) continue;
    std::string path = lines[i].substr(marker.size());
    path = path.substr(0, path.find(" -->"));
    std::size_t open = i + 1;
    if (open >= lines.size() || lines[open].rfind("```", 0) != 0) {
      fail(md.filename().string() + ":" + std::to_string(i + 1),
           "marker not followed by a code block");
      continue;
    }
    std::vector<std::string> block;
    std::size_t j = open + 1;
    for (; j < lines.size() && lines[j].rfind("```", 0) != 0; ++j) block.push_back(lines[j]);
    if (!fs::exists(root / path)) {
      fail(md.filename().string() + ":" + std::to_string(i + 1), "no file " + path);
    } else if (!is_excerpt(block, read_lines(root / path))) {
      fail(md.filename().string() + ":" + std::to_string(i + 1),
           "the code block is not a contiguous excerpt of " + path);
    }
    ++*count;
    i = j;
  }
}

void check_links(const fs::path& md, int* count) {
  const std::vector<std::string> lines = read_lines(md);
  bool fenced = false;
  for (std::size_t n = 0; n < lines.size(); ++n) {
    const std::string& line = lines[n];
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (fenced) continue;
    for (std::size_t at = line.find("]("); at != std::string::npos; at = line.find("](", at + 2)) {
      std::size_t end = line.find(')', at + 2);
      if (end == std::string::npos) break;
      std::string target = line.substr(at + 2, end - at - 2);
      if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 ||
          target.rfind("mailto:", 0) == 0)
        continue;
      std::string where = md.filename().string() + ":" + std::to_string(n + 1);
      std::string file = target.substr(0, target.find('#'));
      std::string anchor =
          target.find('#') == std::string::npos ? "" : target.substr(target.find('#') + 1);
      fs::path resolved = file.empty() ? md : md.parent_path() / file;
      ++*count;
      if (!fs::exists(resolved)) {
        fail(where, "link to a missing file: " + target);
      } else if (!anchor.empty() && resolved.extension() == ".md" &&
                 anchors_of(resolved).count(anchor) == 0) {
        fail(where, "no heading #" + anchor + " in " + resolved.filename().string());
      }
    }
  }
}

constexpr std::size_t kMaxHeaderLines = 600;

void check_header_sizes(const fs::path& root, int* count) {
  for (const auto& entry : fs::recursive_directory_iterator(root / "include")) {
    if (entry.path().extension() != ".hpp") continue;
    ++*count;
    const std::size_t n = read_lines(entry.path()).size();
    if (n > kMaxHeaderLines)
      fail(fs::relative(entry.path(), root).string(),
           std::to_string(n) + " lines, more than " + std::to_string(kMaxHeaderLines));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::printf("usage: attnref_docs_check <source dir>\n");
    return 2;
  }
  const fs::path root = argv[1];
  std::vector<fs::path> pages = {root / "README.md"};
  for (const auto& entry : fs::directory_iterator(root / "docs"))
    if (entry.path().extension() == ".md") pages.push_back(entry.path());
  int snippets = 0, links = 0, headers = 0;
  for (const fs::path& md : pages) {
    check_snippets(root, md, &snippets);
    check_links(md, &links);
  }
  check_header_sizes(root, &headers);
  std::printf("%zu pages, %d quoted snippets, %d relative links, %d headers: %d failures\n",
              pages.size(), snippets, links, headers, failures);
  return failures == 0 ? 0 : 1;
}

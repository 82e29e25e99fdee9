//! A line diff of two job documents, for `GET /jobs/{name}/versions/{a}/diff/{b}`.

/// The lines of `new` against `old`: unchanged lines start with two spaces, removed ones with
/// `- `, added ones with `+ ` (a longest common subsequence; job documents are short).
pub fn lines(old: &str, new: &str) -> String {
    let (old, new): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    // common[i][j]: the longest common subsequence of old[i..] and new[j..].
    let mut common = vec![vec![0usize; new.len() + 1]; old.len() + 1];
    for i in (0..old.len()).rev() {
        for j in (0..new.len()).rev() {
            common[i][j] =
                if old[i] == new[j] { common[i + 1][j + 1] + 1 } else { common[i + 1][j].max(common[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut output) = (0, 0, String::new());
    while i < old.len() || j < new.len() {
        if i < old.len() && j < new.len() && old[i] == new[j] {
            output.push_str(&format!("  {}\n", old[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < old.len() && (j == new.len() || common[i + 1][j] >= common[i][j + 1]) {
            output.push_str(&format!("- {}\n", old[i]));
            i += 1;
        } else {
            output.push_str(&format!("+ {}\n", new[j]));
            j += 1;
        }
    }
    output
}

#[cfg(test)]
mod tests {
    #[test]
    fn changed_lines_are_marked_and_the_rest_kept() {
        let diff = super::lines(
            "name: a\nparallelism: 2\nmode: snapshot\n",
            "name: a\nparallelism: 4\nmode: snapshot\nextra: 1\n",
        );
        assert_eq!(diff, "  name: a\n- parallelism: 2\n+ parallelism: 4\n  mode: snapshot\n+ extra: 1\n");
    }
}

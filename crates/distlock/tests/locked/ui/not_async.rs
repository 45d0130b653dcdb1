#[distlock::locked(locks = locks, name = "report")]
fn report(locks: &distlock::Locks) -> distlock::Result<()> {
    Ok(())
}

fn main() {}
